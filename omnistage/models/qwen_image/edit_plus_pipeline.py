"""Qwen-Image-Edit-Plus (QwenImageEditPlusPipeline, e.g. Qwen-Image-Edit-2509): an edit from 1-3 input images.

Reproduces `diffusers.QwenImageEditPlusPipeline` (pipelines/qwenimage/pipeline_qwenimage_edit_plus.py)
on top of `QwenImageEdit`. What differs from the single-image edit:

- the prompt names each image ("Picture 1: <image> Picture 2: <image> ...") before the
  instruction, in a template without the edit model's one image slot;
- the vision tower reads each image at about 384x384 pixels, the VAE at about 1024x1024
  (the edit model gives both the same ~1024x1024 image);
- the transformer reads every image's latents after the target's, one token grid each;
- the default output size follows the last image.

diffusers' pipeline takes one prompt per call; ours batches requests (each with its own
images) as the other Qwen-Image families do, and matches each one run alone.
"""

from __future__ import annotations

from typing import Any, ClassVar

from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.qwen_image.edit_pipeline import CONDITION_IMAGE_AREA, ConditionImages, QwenImageEdit

# QwenImageEditPlusPipeline's CONDITION_IMAGE_SIZE: the vision tower's view of each image.
VISION_IMAGE_AREA = 384 * 384
PICTURE_PROMPT = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"


class QwenImageEditPlus(QwenImageEdit):
    reference_class: ClassVar[str] = "QwenImageEditPlusPipeline"
    # The reference system serves Edit-2509 with up to three input images.
    max_images: ClassVar[int] = 3

    prompt_template: ClassVar[str] = (
        "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
        "objects, background), then explain how the user's text instruction should alter or modify the image. "
        "Generate a new image that meets the user's requirements while maintaining consistency with the "
        "original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt_template_start_idx: ClassVar[int] = 64

    def _condition_image(self, request: DiffusionRequest) -> ConditionImages:
        return ConditionImages(vision=[self._resized(i, VISION_IMAGE_AREA) for i in request.images],
                               vae=[self._resized(i, CONDITION_IMAGE_AREA) for i in request.images])

    def _templated(self, prompt: str, image: Any) -> str:
        pictures = "".join(PICTURE_PROMPT.format(i + 1) for i in range(len(image.vision)))
        return self.prompt_template.format(pictures + prompt)
