"""Which routes the loaded model serves, decided once from its `PipelineSpec`.

The final stages' output modalities say what a model can answer: images, video, text,
audio, or text and audio. Audio from a diffusion stage (Stable Audio) is generated from a
description (/v1/audio/generate); audio from AR/generation stages reads text aloud (speech). What a text stage takes beside text (images, audio) and its
context length come from the checkpoint's config (`model_facts`), for /v1/models. Whether an image model *takes* an image (edit, I2V) comes from
its native pipeline class (`needs_image`, or `takes_image` when optional); a generic diffusers adapter is only known once
loaded, so both image routes stay open and the engine rejects what does not fit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from omnistage.entrypoints.openai.errors import bad_request

logger = logging.getLogger(__name__)

Task = Literal["images.generations", "images.edits", "videos", "chat", "chat.audio", "responses", "completions",
               "audio.speech", "audio.generate", "audio.transcriptions", "audio.translations", "realtime",
               "realtime.video"]
ImageInput = Literal["none", "required", "optional"]

ROUTES: dict[str, str] = {
    "images.generations": "POST /v1/images/generations",
    "images.edits": "POST /v1/images/edits",
    "videos": "/v1/videos",
    "chat": "POST /v1/chat/completions",
    "responses": "/v1/responses",
    "completions": "POST /v1/completions",
    "audio.speech": "POST /v1/audio/speech",
    "audio.generate": "POST /v1/audio/generate",
    "audio.transcriptions": "POST /v1/audio/transcriptions",
    "audio.translations": "POST /v1/audio/translations",
    "realtime": "WS /v1/realtime",
    "realtime.video": "WS /v1/realtime/video",
}


@dataclass(frozen=True)
class Capabilities:
    model: str
    outputs: frozenset[str]
    """Output modalities over all final stages, e.g. {"text", "audio"}."""
    image_input: ImageInput = "none"
    """Whether a request to an image/video model carries an input image."""
    diffusion_outputs: frozenset[str] = frozenset()
    """Output modalities of the final stages that are diffusion stages, e.g. {"audio"} for Stable Audio."""
    video_input: bool = False
    """Whether a video request may carry a control video and its mask (Wan-VACE)."""
    speech_to_text: bool = False
    """A speech recognition family (its spec's `speech_to_text`, e.g. Qwen3-ASR): it transcribes."""
    duplex: bool = False
    """A full-duplex family (its spec's `duplex`, e.g. Moshi): it serves realtime sessions only,
    in which it listens while it speaks (realtime/duplex.py)."""

    @classmethod
    def from_spec(cls, model: str, spec: Any) -> Capabilities:
        outputs = frozenset(m for stage in spec.final_stages for m in stage.modalities)
        diffusion = frozenset(m for stage in spec.final_stages if stage.kind == "diffusion" for m in stage.modalities)
        return cls(model=model, outputs=outputs, image_input=_image_input(spec), diffusion_outputs=diffusion,
                   video_input=_video_input(spec), speech_to_text=getattr(spec, "speech_to_text", None) is not None,
                   duplex=getattr(spec, "duplex", None) is not None)

    def serves(self, task: str) -> bool:
        if self.duplex:  # its prompt is a live audio stream: no other route can ask it anything
            return task == "realtime"
        if task == "images.generations":
            return "image" in self.outputs and self.image_input != "required"
        if task == "images.edits":
            return "image" in self.outputs and self.image_input != "none"
        if task in ("videos", "realtime.video"):
            return "video" in self.outputs
        if task in ("chat", "responses"):  # Responses runs on the chat path
            return bool({"text", "image"} & self.outputs)
        if task == "audio.transcriptions" and self.speech_to_text:
            return True  # an ASR family: it neither translates nor talks, so only this of the four
        if task in ("chat.audio", "realtime", "audio.transcriptions", "audio.translations"):
            # Voice sessions and transcriptions run on the omni models (text and audio out; their
            # thinkers hear audio).
            return {"text", "audio"} <= self.outputs
        if task == "completions":  # text out of an AR stage (an omni model's thinker included)
            return "text" in self.outputs
        if task == "audio.speech":
            # Speech reads `input` aloud: a TTS pipeline. An omni model (text + audio) would
            # answer the input instead; it speaks through chat with modalities ["audio"].
            # A diffusion model's audio comes from a description, not a text to read.
            return self.outputs == {"audio"} and "audio" not in self.diffusion_outputs
        if task == "audio.generate":  # text -> sound or music, by a diffusion stage
            return "audio" in self.diffusion_outputs
        raise KeyError(task)

    @property
    def routes(self) -> list[str]:
        return [route for task, route in ROUTES.items() if self.serves(task)]

    def require(self, task: str) -> None:
        """400 naming what the model does serve, when it cannot serve `task`."""
        if self.serves(task):
            return
        what = ROUTES.get(task, task)
        if task == "chat.audio":
            what = "audio output (modalities: ['audio'])"
        served = ", ".join(self.routes) or "nothing"
        raise bad_request(f"model {self.model!r} does not serve {what}; it serves: {served}",
                          code="unsupported_route")


def _image_input(spec: Any) -> ImageInput:
    entries = [s for s in spec.entry_stages if s.kind == "diffusion"]
    if not entries:
        return "none"
    if entries[0].model is None:
        return "optional"
    from omnistage.diffusion.registry import is_native, pipeline_class

    if not is_native(entries[0].model):
        return "optional"
    cls = pipeline_class(entries[0].model)
    return "required" if cls.needs_image else "optional" if cls.takes_image else "none"


def _video_input(spec: Any) -> bool:
    entries = [s for s in spec.entry_stages if s.kind == "diffusion" and s.model is not None]
    if not entries:
        return False
    from omnistage.diffusion.registry import is_native, pipeline_class

    return is_native(entries[0].model) and pipeline_class(entries[0].model).takes_video


def model_facts(model_path: str, engine: Any, capabilities: Capabilities) -> dict[str, Any]:
    """What /v1/models says about the model beyond its routes: `max_model_len` of the entry
    AR stage (the deploy value, else the checkpoint's max_position_embeddings; None without
    an AR entry stage), and the input and output modalities."""
    inputs = {"text"}
    if capabilities.image_input != "none":
        inputs.add("image")
    if capabilities.video_input:  # a control video (Wan-VACE)
        inputs.add("video")
    max_model_len = None
    spec = getattr(engine, "spec", None)
    entry = spec.entry_stages[0] if spec is not None else None
    if entry is not None and entry.kind == "ar":
        config = getattr(engine, "config", None)
        if config is not None:
            max_model_len = config.stage_config(entry.id).max_model_len
        checkpoint = _checkpoint_config(model_path)
        if checkpoint is not None:
            inputs |= _encoder_modalities(checkpoint)
            if max_model_len is None:
                max_model_len = getattr(checkpoint.get_text_config(), "max_position_embeddings", None)
    return {"max_model_len": max_model_len,
            "modalities": {"input": sorted(inputs), "output": sorted(capabilities.outputs)}}


def media_inputs(model_path: str) -> frozenset[str] | None:
    """The media a text model's checkpoint has encoders for ("image", "audio"; a video is
    read by the vision encoder), or None when the path holds no transformers config (a
    request's media parts are then left to the engine)."""
    checkpoint = _checkpoint_config(model_path)
    return None if checkpoint is None else frozenset(_encoder_modalities(checkpoint))


def _checkpoint_config(model_path: str) -> Any:
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model_path)
    except Exception as e:  # no config.json (a fake engine, a diffusers folder), or an unknown model_type
        logger.debug("no transformers config at %s: %s", model_path, e)
        return None


def _encoder_modalities(config: Any) -> set[str]:
    """Modalities the checkpoint has an encoder for: a `vision_config` / `audio_config`
    anywhere in its (nested) configs, as Qwen2.5-Omni's thinker has."""
    from transformers import PretrainedConfig

    found: set[str] = set()
    todo = [config]
    while todo:
        current = todo.pop()
        for name, value in vars(current).items():
            if isinstance(value, PretrainedConfig):
                if name.startswith("vision"):
                    found.add("image")
                elif name.startswith("audio"):
                    found.add("audio")
                todo.append(value)
    return found
