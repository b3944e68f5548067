"""GLM-Image's AR prior as an AR stage: prompt + target size -> image tokens.

Wraps transformers' `GlmImageForConditionalGeneration` (the checkpoint's
`vision_language_encoder/`) without patching it: the engine's masks and paged KV cache go
into its language model through the public `attention_mask` and `cache=` arguments.

Per request (`PriorState`), prepared at admission from the checkpoint's `processor/`
exactly as `GlmImagePipeline.generate_prior_tokens` prepares `generate`'s inputs:
- the prompt: the chat template over one user text, then the processor's target-grid text
  and the image-start token;
- the M-RoPE positions: the prompt's from the model's own `get_rope_index`, and those of
  every token it will write (`decode_positions`): each generated grid (preview, then
  target) sits at 2D (row, col) positions after the previous one, as the model's decode
  cache lays them out;
- the stop: after `grid.num_new_tokens` tokens (`generate`'s max_new_tokens) the last one
  is written as the image-end token, whatever the sampling params' max_tokens say.

The engine samples with the stage's params: the deploy's `default_sampling_params` are
the checkpoint's generation_config.json rules (temperature, top-k, top-p; `prior_sampling`
in the package `__init__`), and the seed is the image's (`processors.py`), as the
reference seeds `generate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.models.glm_image.grid import PriorGrid, prior_grid

MODEL_FOLDER, PROCESSOR_FOLDER = "vision_language_encoder", "processor"


@dataclass
class PriorState:
    grid: PriorGrid
    prompt_positions: torch.Tensor
    """[3, L] long: the prompt's M-RoPE positions."""
    decode_positions: torch.Tensor
    """[3, grid.num_new_tokens] long: the positions of the tokens it writes, in order."""


class GlmImagePrior(ARModel):
    # Prompts are token ids with positions known for every index: they chunk, share cached
    # prefixes and recompute after a preemption.
    supports_chunked_prefill = True
    supports_prepacked_linears = True  # transformers' layers only call their linears

    def __init__(self, model, processor, eos: tuple[int, ...], device: torch.device) -> None:
        text_config = model.config.text_config
        self.model = model
        self.processor = processor
        self.tokenizer = None  # the output is image codes, not text
        self.eos_token_ids = eos
        self.image_end_token_id = model.config.image_end_token_id
        self.device = device
        self.num_layers = text_config.num_hidden_layers
        self.kv_dims = kv_dims(text_config)
        self.max_position_embeddings = text_config.max_position_embeddings

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> GlmImagePrior:
        from transformers import GlmImageForConditionalGeneration, GlmImageProcessor

        # subfolder=: a local folder or a hub id alike.
        model = GlmImageForConditionalGeneration.from_pretrained(model_path, subfolder=MODEL_FOLDER, dtype=dtype,
                                                                 attn_implementation="sdpa")
        processor = GlmImageProcessor.from_pretrained(model_path, subfolder=PROCESSOR_FOLDER)
        eos = model.generation_config.eos_token_id  # generation_config.json, as generate() reads it
        eos = model.config.text_config.eos_token_id if eos is None else eos
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        return cls(model.to(device).eval(), processor, eos, device)

    # --- admission -----------------------------------------------------------------------------

    def build_prompt(self, inputs: Any) -> PromptInputs:
        """`{"prompt": str, "height": int, "width": int}` -> the prompt ids and the positions."""
        if not isinstance(inputs, dict) or sorted(inputs) != ["height", "prompt", "width"]:
            raise ValueError("GLM-Image prior inputs must be a dict with keys prompt, height, width")
        height, width = inputs["height"], inputs["width"]
        messages = [[{"role": "user", "content": [{"type": "text", "text": inputs["prompt"]}]}]]
        enc = self.processor.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_tensors="pt",
            processor_kwargs={"padding": False, "target_h": height, "target_w": width})
        ids = enc["input_ids"].to(self.device)
        grids = enc["image_grid_thw"].to(self.device)
        with torch.inference_mode():
            positions, _ = self.model.model.get_rope_index(ids, grids, enc["images_per_sample"],
                                                           enc["attention_mask"].to(self.device))
        grid = prior_grid(height, width)
        state = PriorState(grid, positions[:, 0], decode_positions(ids.shape[1], grid, self.device))
        return PromptInputs(ids[0].tolist(), state)

    # --- the forward ---------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        out = self.model.model(input_ids=batch.input_ids, position_ids=self._positions(batch),
                               attention_mask=sdpa_mask(batch), cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if batch.is_prefill:
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            last = hidden[:, -1]
        return ModelOutput(logits=self.model.lm_head(last))

    def _positions(self, batch: ModelInput) -> torch.Tensor:
        """[3, B, T]: each token's position, inside its prompt or among the tokens written after it."""
        pos = batch.positions.new_zeros(3, *batch.positions.shape)
        for i, seq in enumerate(batch.seqs):
            state: PriorState = seq.model_state
            table = torch.cat([state.prompt_positions, state.decode_positions], dim=1)
            n = batch.query_lens[i]
            pos[:, i, :n] = table[:, batch.positions[i, :n]]
        return pos

    def on_sampled(self, batch: ModelInput, output: ModelOutput, token_ids: torch.Tensor) -> list[dict] | None:
        # generate()'s max_new_tokens: the grid's last token is followed by the image end.
        for i, seq in enumerate(batch.seqs):
            if seq.num_output_tokens + 1 >= seq.model_state.grid.num_new_tokens:
                token_ids[i] = self.image_end_token_id
        return None

    def close(self) -> None:
        self.model = self.processor = None


def decode_positions(prompt_len: int, grid: PriorGrid, device: torch.device | str = "cpu") -> torch.Tensor:
    """[3, grid.num_new_tokens]: the M-RoPE positions of the tokens a text-to-image prompt of
    `prompt_len` tokens is continued with (GlmImageModel.get_rope_index's decode cache):
    the preview grid then the target grid, each at (start, start + row, start + col) with
    `start` moving past the previous grid by its longer side, then the end token."""
    parts, start = [], prompt_len
    for h, w in ((grid.preview_h, grid.preview_w), (grid.token_h, grid.token_w)):
        rows = torch.arange(h, device=device)[:, None].expand(h, w).flatten()
        cols = torch.arange(w, device=device)[None, :].expand(h, w).flatten()
        parts.append(torch.stack([torch.full_like(rows, start), start + rows, start + cols]))
        start += max(h, w)
    parts.append(torch.full((3, 1), start, device=device, dtype=torch.long))
    return torch.cat(parts, dim=1)
