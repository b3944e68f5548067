"""Which routes each registered family serves, from its real PipelineSpec."""

from __future__ import annotations

import pytest

from omnistage.entrypoints.openai.capabilities import Capabilities


@pytest.mark.parametrize("module, name, routes, image_input", [
    ("z_image", "Z_IMAGE", ["POST /v1/images/generations", "POST /v1/chat/completions", "/v1/responses"], "none"),
    ("qwen_image", "QWEN_IMAGE_EDIT", ["POST /v1/images/edits", "POST /v1/chat/completions", "/v1/responses"], "required"),
    ("qwen_image", "QWEN_IMAGE_LAYERED", ["POST /v1/images/edits", "POST /v1/chat/completions", "/v1/responses"],
     "required"),
    ("flux2", "FLUX2", ["POST /v1/images/generations", "POST /v1/images/edits", "POST /v1/chat/completions", "/v1/responses"],
     "optional"),
    ("flux", "FLUX_KONTEXT", ["POST /v1/images/generations", "POST /v1/images/edits", "POST /v1/chat/completions",
                              "/v1/responses"], "optional"),
    ("sdxl", "SDXL", ["POST /v1/images/generations", "POST /v1/chat/completions", "/v1/responses"], "none"),
    ("ernie_image", "ERNIE_IMAGE", ["POST /v1/images/generations", "POST /v1/chat/completions", "/v1/responses"],
     "none"),
    ("ovis_image", "OVIS_IMAGE", ["POST /v1/images/generations", "POST /v1/chat/completions", "/v1/responses"],
     "none"),
    ("krea2", "KREA2", ["POST /v1/images/generations", "POST /v1/chat/completions", "/v1/responses"], "none"),
    ("longcat_image", "LONGCAT_IMAGE", ["POST /v1/images/generations", "POST /v1/chat/completions",
                                        "/v1/responses"], "none"),
    ("longcat_image", "LONGCAT_IMAGE_EDIT", ["POST /v1/images/edits", "POST /v1/chat/completions", "/v1/responses"],
     "required"),
    ("hidream_image", "HIDREAM_IMAGE", ["POST /v1/images/generations", "POST /v1/chat/completions",
                                        "/v1/responses"], "none"),
    ("wan", "WAN_T2V", ["/v1/videos", "WS /v1/realtime/video"], "none"),
    ("wan", "WAN_I2V", ["/v1/videos", "WS /v1/realtime/video"], "required"),
    ("wan", "WAN_VACE", ["/v1/videos", "WS /v1/realtime/video"], "optional"),
    ("hunyuan_video", "HUNYUAN_VIDEO_T2V", ["/v1/videos", "WS /v1/realtime/video"], "none"),
    ("hunyuan_video", "HUNYUAN_VIDEO_I2V", ["/v1/videos", "WS /v1/realtime/video"], "required"),
    ("sana_video", "SANA_VIDEO_T2V", ["/v1/videos", "WS /v1/realtime/video"], "none"),
    ("sana_video", "SANA_VIDEO_I2V", ["/v1/videos", "WS /v1/realtime/video"], "required"),
    ("helios", "HELIOS_T2V", ["/v1/videos", "WS /v1/realtime/video"], "none"),
    ("llm", "QWEN2", ["POST /v1/chat/completions", "/v1/responses", "POST /v1/completions"], "none"),
])
def test_routes_of_registered_families(module, name, routes, image_input):
    import importlib

    spec = getattr(importlib.import_module(f"omnistage.models.{module}"), name)
    caps = Capabilities.from_spec("m", spec)
    assert caps.routes == routes and caps.image_input == image_input
    assert not caps.serves("audio.speech") and not caps.serves("chat.audio")
    assert not any(caps.serves(t) for t in ("realtime", "audio.transcriptions", "audio.translations"))


def test_omni_families_serve_voice_sessions_and_transcriptions():
    from omnistage.models.qwen2_5_omni import QWEN2_5_OMNI
    from omnistage.models.qwen3_omni import QWEN3_OMNI

    for spec in (QWEN2_5_OMNI, QWEN3_OMNI):
        assert Capabilities.from_spec("m", spec).routes == [
            "POST /v1/chat/completions", "/v1/responses", "POST /v1/completions", "POST /v1/audio/transcriptions",
            "POST /v1/audio/translations", "WS /v1/realtime"]


def test_model_facts_come_from_the_checkpoint_and_the_deploy_config(zoo):
    from types import SimpleNamespace

    from omnistage.config.spec import PipelineSpec, StageSpec
    from omnistage.entrypoints.openai.capabilities import model_facts

    def engine(kind, output, max_model_len=None):
        spec = PipelineSpec(name="p", stages=(StageSpec(id=0, name="s", kind=kind, output=output, final_output=True),))
        config = SimpleNamespace(stage_config=lambda _: SimpleNamespace(max_model_len=max_model_len))
        return SimpleNamespace(spec=spec, config=config)

    llm = engine("ar", "text")
    assert model_facts(str(zoo("qwen2-llm")), llm, Capabilities.from_spec("m", llm.spec)) == {
        "max_model_len": 2048, "modalities": {"input": ["text"], "output": ["text"]}}
    capped = engine("ar", "text", max_model_len=300)
    assert model_facts(str(zoo("qwen2-llm")), capped, Capabilities.from_spec("m", capped.spec))["max_model_len"] == 300
    omni = engine("ar", "text")
    facts = model_facts(str(zoo("qwen2.5-omni")), omni, Capabilities.from_spec("m", omni.spec))
    assert facts["modalities"]["input"] == ["audio", "image", "text"] and facts["max_model_len"] == 4096
    image = engine("diffusion", "image")
    assert model_facts("/nowhere", image, Capabilities("m", frozenset({"image"}), "optional")) == {
        "max_model_len": None, "modalities": {"input": ["image", "text"], "output": ["image"]}}
    from omnistage.models.wan import WAN_VACE

    vace = SimpleNamespace(spec=WAN_VACE, config=None)
    assert model_facts("/nowhere", vace, Capabilities.from_spec("m", WAN_VACE))["modalities"] == {
        "input": ["image", "text", "video"], "output": ["video"]}
