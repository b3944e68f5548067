"""Prompt expansion, then drawing: a text LLM rewrites the prompt, a diffusion model draws it.

    stage 0 "expander" (ar, text, final): chat-prompted LLM -> a detailed image description
    stage 1 "drawer"   (diffusion, image, final): that description is its prompt

The request returns both: `.text` is the expanded prompt, `.images` the picture.

Two models, one pipeline folder. A multi-model pipeline is a folder whose `config.json`
names the registered pipeline (`model_type`, so detection finds it like any checkpoint)
and each stage's checkpoint by stage name (`stage_models`: relative to the folder,
absolute, or a hub id); see `omnistage.engine.factory.stage_model_paths`:

    my-expand-image/config.json
      {"model_type": "prompt_expand_image",
       "stage_models": {"expander": "/models/qwen2.5-0.5b-instruct",   # a causal LM with a chat template
                        "drawer": "/models/z-image-turbo"}}            # a text-to-image diffusers folder

`write_pipeline_folder` makes one. Per-stage params go by stage name:

    Omni("my-expand-image").generate("a cat", {"expander": SamplingParams(max_tokens=64),
                                              "drawer": DiffusionParams(num_inference_steps=8)})
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omnistage.config import PipelineSpec, StageSpec, register_pipeline

KEY = "prompt_expand_image"
INSTRUCTION = (
    "Rewrite the user's image prompt as one detailed description of the picture: subject, "
    "setting, lighting, style. Answer with the description only."
)


def expander_input(request: Any, upstream: Mapping[int, Any]) -> dict[str, Any]:
    """The user's prompt (a str, or {"prompt": str}) as a chat for the LLM."""
    prompt = request.prompt.get("prompt") if isinstance(request.prompt, Mapping) else request.prompt
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"prompt must be a non-empty string (or {{'prompt': str}}), got {request.prompt!r}")
    return {"messages": [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": prompt}]}


def drawer_input(request: Any, upstream: Mapping[int, Any]) -> dict[str, Any]:
    """The expander's text is the diffusion prompt."""
    text = upstream[0].text.strip()
    if not text:
        raise ValueError("the expander produced no text to draw")
    return {"prompt": text}


PROMPT_EXPAND_IMAGE = PipelineSpec(
    name=KEY,
    stages=(
        StageSpec(0, "expander", "ar", "text", final_output=True, input_processor=expander_input),
        StageSpec(1, "drawer", "diffusion", "image", inputs=(0,), final_output=True, input_processor=drawer_input),
    ),
)

register_pipeline(KEY, PROMPT_EXPAND_IMAGE)


def write_pipeline_folder(out_dir: str | os.PathLike, expander: str | os.PathLike,
                          drawer: str | os.PathLike) -> Path:
    """Make a pipeline folder naming the two checkpoints (see the module docstring)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stage_models = {"expander": str(Path(expander).resolve()), "drawer": str(Path(drawer).resolve())}
    (out / "config.json").write_text(json.dumps({"model_type": KEY, "stage_models": stage_models}, indent=2) + "\n")
    return out
