"""Which routes each registered family serves, from its real PipelineSpec."""

from __future__ import annotations

import pytest

from omnistage.entrypoints.openai.capabilities import Capabilities


@pytest.mark.parametrize("module, name, routes, image_input", [
    ("z_image", "Z_IMAGE", ["POST /v1/images/generations", "POST /v1/chat/completions"], "none"),
    ("qwen_image", "QWEN_IMAGE_EDIT", ["POST /v1/images/edits", "POST /v1/chat/completions"], "required"),
    ("wan", "WAN_T2V", ["/v1/videos"], "none"),
    ("wan", "WAN_I2V", ["/v1/videos"], "required"),
    ("llm", "QWEN2", ["POST /v1/chat/completions", "POST /v1/completions"], "none"),
])
def test_routes_of_registered_families(module, name, routes, image_input):
    import importlib

    spec = getattr(importlib.import_module(f"omnistage.models.{module}"), name)
    caps = Capabilities.from_spec("m", spec)
    assert caps.routes == routes and caps.image_input == image_input
    assert not caps.serves("audio.speech") and not caps.serves("chat.audio")
