"""/v1/models lists what a bare request gets; the demo's deploy file makes that cheap, and
real models keep their checkpoint's defaults."""

from __future__ import annotations

from types import SimpleNamespace

from fastapi.testclient import TestClient

from omnistage.config.deploy import bundled_deploy_path
from omnistage.entrypoints.commands.serve import demo_deploy_config
from omnistage.entrypoints.omni import load_config
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app
from omnistage.entrypoints.openai.defaults import effective_defaults


def engine_view(model, deploy=None):
    """What /v1/models reads from an AsyncOmni (its spec and config), without loading engines."""
    config = load_config(model, deploy, None, {})
    return SimpleNamespace(spec=config.pipeline, config=config)


def test_a_real_model_keeps_its_checkpoint_defaults_and_the_demo_gets_cheap_ones(zoo):
    path = zoo("z-image")
    real = effective_defaults(engine_view(path))["diffusion"]
    assert (real["height"], real["width"], real["num_inference_steps"]) == (1024, 1024, 50)
    assert real["extras"]["max_sequence_length"] == 512

    assert demo_deploy_config(None, is_demo=False) is None
    assert demo_deploy_config("mine.yaml", is_demo=True) == "mine.yaml"
    demo = effective_defaults(engine_view(path, demo_deploy_config(None, is_demo=True)))["diffusion"]
    assert (demo["height"], demo["width"], demo["num_inference_steps"]) == (256, 256, 4)
    assert demo["guidance_scale"] == real["guidance_scale"]  # what the demo file leaves alone stays
    assert demo_deploy_config(None, is_demo=True) == bundled_deploy_path("z_image_demo.yaml")


def test_v1_models_lists_each_stages_defaults(zoo):
    llm = engine_view(zoo("qwen2-llm"))
    llm.shutdown = lambda: None
    app = create_app(ServerSettings(served_model_name="m", model_path="p"), llm)
    with TestClient(app) as http:
        [model] = http.get("/v1/models").json()["data"]
    [stage] = llm.spec.stages
    assert model["defaults"][stage.name]["temperature"] == 1.0 and "max_tokens" in model["defaults"][stage.name]


def test_speech_families_have_a_default_length(zoo):
    """A bare speech request is bounded (CSM's spoke 162 s, to max_model_len), and a deploy file can lift it."""
    talker = effective_defaults(engine_view(zoo("csm")))["talker"]
    assert talker["max_tokens"] == 750  # 60 s at 12.5 frames/s


def test_v1_models_lists_what_a_bare_request_runs_with(zoo):
    """The engine fills a bare request from the same declarations /v1/models reads: the deploy's
    defaults, then the family's as its checkpoint sets them (FLUX's size comes from its VAE, its
    prompt length is capped by its tokenizer), so the two cannot drift apart."""
    from omnistage.core.types import StageRequest
    from omnistage.diffusion.engine import DiffusionEngine
    from omnistage.diffusion.params import DiffusionParams

    path = str(zoo("flux"))
    config = load_config(path, None, {"0": {"default_sampling_params": {"num_inference_steps": 2}}}, {})
    [stage] = config.pipeline.stages
    listed = effective_defaults(SimpleNamespace(spec=config.pipeline, config=config))[stage.name]
    with DiffusionEngine(path, stage, config.stage_config(stage.id)) as engine:
        engine.add_request(StageRequest("bare", "a cat"))
        ran = engine.scheduler.get_request("bare").request.params
    assert listed["num_inference_steps"] == 2 and listed["height"] == ran.height is not None
    assert ran.model_dump(exclude={"seed"}) == DiffusionParams(**listed).model_dump(exclude={"seed"})
