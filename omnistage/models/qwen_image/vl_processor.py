"""A checkpoint's Qwen-VL processor (Qwen2VLProcessor, Qwen3VLProcessor) built from its two halves.

transformers 5.24 refuses to construct either class without torchvision: the video
processor slot is type-checked against a class transformers only exports when torchvision
imports. Their `__call__` and `apply_chat_template` on text and images use only the image
processor and the tokenizer, so this sets those (and the special tokens `__init__` would
look up) on an instance directly. diffusers' Qwen-Image 2.1 pipeline needs such an object
to be constructed at all (its `__init__` renders the chat template), and the parity tests
call diffusers' edit pipelines through one. `expand_image_tokens` is what the processor does to
a prompt's image placeholders (Qwen-Image-Edit's and LongCat-Image-Edit's text inputs).
"""

from __future__ import annotations

from typing import Any


def processor_from_parts(processor_cls: type, path: str, subfolder: str = "processor") -> Any:
    """`processor_cls` with the image processor and tokenizer of `path`/`subfolder` and no video half."""
    from transformers import AutoImageProcessor, AutoTokenizer

    processor = processor_cls.__new__(processor_cls)
    processor.tokenizer = AutoTokenizer.from_pretrained(str(path), subfolder=subfolder)
    processor.image_processor = AutoImageProcessor.from_pretrained(str(path), subfolder=subfolder)
    processor.chat_template = processor.tokenizer.chat_template
    processor.image_token, processor.video_token = "<|image_pad|>", "<|video_pad|>"
    processor.vision_start_token, processor.vision_end_token = "<|vision_start|>", "<|vision_end|>"
    for name in ("image_token", "video_token", "vision_start_token", "vision_end_token"):
        setattr(processor, f"{name}_id", processor.tokenizer.convert_tokens_to_ids(getattr(processor, name)))
    return processor


IMAGE_TOKEN = "<|image_pad|>"


def expand_image_tokens(text: str, grids: Any, merge: int) -> str:
    """`text` with each image placeholder expanded to one token per merged patch of the next
    image's grid from `grids` (an iterator over image_grid_thw rows), as Qwen2VLProcessor does."""
    parts = text.split(IMAGE_TOKEN)
    out = parts[0]
    for part in parts[1:]:
        out += IMAGE_TOKEN * int(next(grids).prod() // merge) + part
    return out


def prenorm_last_hidden_states(text_encoder: Any, inputs: dict[str, Any]) -> Any:
    """A Qwen3-VL encoder's last decoder layer output before the final norm, which Qwen-Image 2.1
    and JoyAI-Image were trained on (transformers 5 ties `hidden_states[-1]` to the normed
    output): a hook returning the norm's input stands in for its output, as diffusers hooks it."""
    text_model = getattr(text_encoder.model, "language_model", text_encoder.model)
    handle = text_model.norm.register_forward_hook(lambda module, args, output: args[0])
    try:
        return text_encoder(**inputs, output_hidden_states=True).hidden_states[-1]
    finally:
        handle.remove()
