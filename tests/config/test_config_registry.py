"""Pipeline resolution: every rule in order, resolvers, bundled defaults, plugins, hub cache."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import textwrap
import types

import pytest
from config_helpers import stage

from omnistage.config import (
    ModelFiles,
    PipelineDeployConfig,
    PipelineSpec,
    build_effective_config,
    load_deploy_config,
    load_entry_points,
    register_pipeline,
    registered_pipelines,
    resolve,
    resolve_pipeline,
)
from omnistage.config import platform as platform_mod
from omnistage.config import registry as registry_mod
from omnistage.config.deploy import BUNDLED_DIR

pytestmark = pytest.mark.usefixtures("registry")


def one_stage(name: str, kind: str = "ar", output: str = "text") -> PipelineSpec:
    return PipelineSpec(name=name, stages=(stage(0, kind=kind, output=output, final_output=True),))


# --- the rules, in order ---------------------------------------------------------------


def test_model_type(make_model):
    r = resolve_pipeline(make_model(config={"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    assert (r.key, r.rule) == ("qwen2", "config.json model_type")
    assert r.spec.stages[0].kind == "ar" and r.spec.stages[0].output == "text"


def test_architectures_when_model_type_unknown(make_model):
    r = resolve_pipeline(make_model(config={"model_type": "qwen2_custom", "architectures": ["Qwen2ForCausalLM"]}))
    assert (r.key, r.rule) == ("Qwen2ForCausalLM", "config.json architectures")


def test_model_type_beats_architectures(make_model):
    register_pipeline("mytype", one_stage("by_type"))
    register_pipeline("MyArch", one_stage("by_arch"))
    assert resolve(make_model(config={"model_type": "mytype", "architectures": ["MyArch"]})).name == "by_type"


def test_config_json_beats_model_index(make_model):
    register_pipeline("MyArch", one_stage("by_arch"))
    model = make_model(config={"architectures": ["MyArch"]}, model_index={"_class_name": "FluxPipeline"})
    assert resolve(model).name == "by_arch"


@pytest.mark.parametrize(
    "class_name, family, output",
    [
        ("ZImagePipeline", "z_image", "image"),
        ("QwenImagePipeline", "qwen_image", "image"),
        ("QwenImageEditPipeline", "qwen_image_edit", "image"),
        ("QwenImageLayeredPipeline", "qwen_image_layered", "image"),
        ("FluxPipeline", "flux", "image"),
        ("FluxKontextPipeline", "flux_kontext", "image"),
        ("Flux2Pipeline", "flux2", "image"),
        ("Flux2KleinPipeline", "flux2_klein", "image"),
        ("StableDiffusion3Pipeline", "sd3", "image"),
        ("StableDiffusionXLPipeline", "sdxl", "image"),
        ("ErnieImagePipeline", "ernie_image", "image"),
        ("OvisImagePipeline", "ovis_image", "image"),
        ("Krea2Pipeline", "krea2", "image"),
        ("LongCatImagePipeline", "longcat_image", "image"),
        ("LongCatImageEditPipeline", "longcat_image_edit", "image"),
        ("HiDreamImagePipeline", "hidream_image", "image"),
        ("WanPipeline", "wan_t2v", "video"),
        ("WanImageToVideoPipeline", "wan_i2v", "video"),
    ],
)
def test_diffusers_families(make_model, class_name, family, output):
    r = resolve_pipeline(make_model(model_index={"_class_name": class_name, "_diffusers_version": "0.42.1"}))
    assert (r.key, r.rule) == (class_name, "model_index.json _class_name")
    (s,) = r.spec.stages
    assert (r.spec.name, s.kind, s.output, s.model, s.final_output) == (family, "diffusion", output, class_name, True)


def test_causal_lm_fallback_pattern(make_model):
    r = resolve_pipeline(make_model(config={"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    assert r.key == "*ForCausalLM"
    assert r.rule == "config.json architectures (pattern '*ForCausalLM')"
    assert r.spec.stages[0].kind == "ar"
    assert r.deploy.path == BUNDLED_DIR / "llm.yaml"


def test_exact_key_anywhere_beats_a_pattern(make_model):
    register_pipeline("MyPipeline", one_stage("exact", kind="diffusion", output="image"))
    model = make_model(config={"architectures": ["LlamaForCausalLM"]}, model_index={"_class_name": "MyPipeline"})
    assert resolve(model).name == "exact"


@pytest.mark.parametrize(
    "class_name, output",
    [
        ("SomeNewImagePipeline", "image"),
        ("HunyuanVideoPipeline", "video"),
        ("CogVideoXPipeline", "video"),
        ("LTXPipeline", "video"),
        ("MochiPipeline", "video"),
    ],
)
def test_default_single_diffusion_stage(make_model, class_name, output):
    r = resolve_pipeline(make_model(model_index={"_class_name": class_name}))
    assert (r.key, r.rule) == (class_name, "default diffusion stage")
    (s,) = r.spec.stages
    assert (s.kind, s.output, s.model, s.final_output) == ("diffusion", output, None, True)
    assert r.deploy.path == BUNDLED_DIR / "base.yaml"


def test_deploy_pipeline_key_beats_detection(make_model, write_yaml):
    deploy = write_yaml("d.yaml", {"pipeline": "FluxPipeline"})
    r = resolve_pipeline(make_model(model_index={"_class_name": "ZImagePipeline"}), deploy)
    assert r.key == "FluxPipeline" and r.rule.startswith("deploy file `pipeline:` key")
    assert r.deploy.path == deploy  # the user's file, not the bundled flux.yaml
    # and it needs no model files at all
    assert resolve_pipeline(make_model("empty"), load_deploy_config(deploy)).key == "FluxPipeline"


def test_deploy_pipeline_key_unknown(make_model, write_yaml):
    deploy = write_yaml("d.yaml", {"pipeline": "FluxPipelin"})
    with pytest.raises(ValueError) as info:
        resolve(make_model(), deploy)
    msg = str(info.value)
    assert "d.yaml: pipeline: unknown pipeline 'FluxPipelin'; did you mean 'FluxPipeline'?" in msg
    assert "(registered: " in msg and "ZImagePipeline" in msg


def test_nothing_matches(make_model):
    with pytest.raises(ValueError) as info:
        resolve(make_model(config={"model_type": "foo", "architectures": ["FooModel"]}))
    msg = str(info.value)
    assert "model_type='foo', architectures=['FooModel']" in msg
    registered = msg.split("Registered: ")[1]
    assert "*ForCausalLM" in registered and "FluxPipeline" in registered and "qwen2" in registered
    with pytest.raises(ValueError, match="has neither config.json nor model_index.json"):
        resolve(make_model("empty"))


def test_missing_local_path(tmp_path):
    with pytest.raises(ValueError, match="is not a local folder"):
        resolve(str(tmp_path / "does-not-exist"))


# --- bundled defaults and resolvers ----------------------------------------------------


def test_family_bundled_deploy_is_the_default(make_model):
    r = resolve_pipeline(make_model(model_index={"_class_name": "QwenImageEditPipeline"}))
    assert r.deploy.path == BUNDLED_DIR / "qwen_image_edit.yaml"
    assert r.deploy.body.stage_fields[0]["max_num_seqs"] == 1


def test_resolver_sees_model_files_and_pipeline_fields(make_model, write_yaml):
    seen = {}

    def omni(files: ModelFiles, deploy: PipelineDeployConfig) -> PipelineSpec:
        seen["config"] = files.config
        if deploy.output_modalities == ("text",):
            return one_stage("thinker_only")
        return PipelineSpec(name="full", stages=(stage(0), stage(1, output="audio", inputs=(0,), final_output=True)))

    register_pipeline("fake_omni", omni)
    model = make_model(config={"model_type": "fake_omni", "enable_audio_output": True})
    assert resolve(model).name == "full"
    assert seen["config"]["enable_audio_output"] is True
    text_only = write_yaml("text.yaml", {"output_modalities": ["text"]})
    assert resolve(model, text_only).name == "thinker_only"
    # A platform overlay of a pipeline-wide field reaches the resolver too.
    overlay = write_yaml("o.yaml", {"platforms": {"cpu": {"output_modalities": ["text"]}}})
    assert resolve(model, overlay, platform="cpu").name == "thinker_only"
    assert resolve(model, overlay, platform="cuda").name == "full"


def test_resolver_must_return_a_spec(make_model):
    register_pipeline("broken", lambda files, deploy: {"stages": []})
    with pytest.raises(TypeError, match="resolver for 'broken' returned dict"):
        resolve(make_model(config={"model_type": "broken"}))


def test_register_rules():
    spec = one_stage("x")
    register_pipeline("k", spec)
    with pytest.raises(ValueError, match="'k' is already registered"):
        register_pipeline("k", spec)
    register_pipeline("k", one_stage("y"), replace=True)
    with pytest.raises(ValueError, match="non-empty string"):
        register_pipeline("", spec)
    with pytest.raises(TypeError, match="PipelineSpec or a resolver"):
        register_pipeline("j", 42)


@pytest.mark.parametrize("key", [k for k in registry_mod.REGISTRY.keys()])
@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_every_registered_family_fits_its_bundled_deploy_file(key, platform, make_model):
    entry = registry_mod.REGISTRY._entries[key]
    # Resolvers get a model with no files: one that cannot build its spec from that is broken.
    spec = entry.build(ModelFiles(str(make_model())), PipelineDeployConfig())
    deploy = load_deploy_config(BUNDLED_DIR / entry.deploy_config)
    cfg = build_effective_config(spec, deploy, platform=platform)
    assert set(cfg.stage_configs) == set(spec.stage_ids)


# --- hub ids ----------------------------------------------------------------------------


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache folder with no network: `add(repo_id, {filename: dict})`."""
    import huggingface_hub.constants as hf_constants

    root = tmp_path / "hub"
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)

    def add(repo_id: str, files: dict) -> None:
        commit = "0123456789abcdef0123456789abcdef01234567"
        repo = root / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for name, content in files.items():
            (snapshot / name).write_text(json.dumps(content))

    return add


def test_hub_id_diffusers_from_cache(hub_cache):
    hub_cache("Tongyi-MAI/Z-Image-Turbo", {"model_index.json": {"_class_name": "ZImagePipeline"}})
    r = resolve_pipeline("Tongyi-MAI/Z-Image-Turbo")
    assert (r.key, r.rule) == ("ZImagePipeline", "model_index.json _class_name")


def test_hub_id_transformers_from_cache(hub_cache):
    hub_cache("Qwen/Qwen2.5-0.5B-Instruct", {"config.json": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}})
    assert resolve_pipeline("Qwen/Qwen2.5-0.5B-Instruct").key == "qwen2"


def test_hub_id_not_cached_and_offline(hub_cache):
    with pytest.raises(ValueError, match="is not a local folder"):
        resolve("org/not-downloaded")


# --- plugins and family discovery -------------------------------------------------------


def write_plugin(tmp_path, monkeypatch, module: str, body: str) -> None:
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))


PLUGIN = """
    from omnistage.config import PipelineSpec, StageSpec, register_pipeline

    CALLS = []

    def register():
        CALLS.append(1)
        stage = StageSpec(id=0, name="tts", kind="generation", output="audio", final_output=True)
        register_pipeline("PluginTTS", PipelineSpec(name="plugin_tts", stages=(stage,)))
"""


def test_entry_point_object(tmp_path, monkeypatch, make_model):
    write_plugin(tmp_path, monkeypatch, "omni_plugin_a", PLUGIN)
    ep = importlib.metadata.EntryPoint(name="tts", value="omni_plugin_a:register", group="omnistage.pipelines")
    load_entry_points([ep])
    assert sys.modules["omni_plugin_a"].CALLS == [1]
    assert "PluginTTS" in registered_pipelines()
    assert resolve(make_model(config={"architectures": ["PluginTTS"]})).name == "plugin_tts"


def test_entry_point_from_installed_distribution(tmp_path, monkeypatch):
    write_plugin(tmp_path, monkeypatch, "omni_plugin_b", PLUGIN.replace("PluginTTS", "PluginB"))
    dist = tmp_path / "omni_plugin_b-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: omni-plugin-b\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[omnistage.pipelines]\nb = omni_plugin_b:register\n")
    load_entry_points()  # the installed distributions' entry points, as discovery runs them
    assert "PluginB" in registered_pipelines()


def test_failing_entry_point_is_named(tmp_path, monkeypatch):
    write_plugin(tmp_path, monkeypatch, "omni_plugin_c", "def register():\n    raise ImportError('needs foo')\n")
    ep = importlib.metadata.EntryPoint(name="c", value="omni_plugin_c:register", group="omnistage.pipelines")
    with pytest.raises(RuntimeError, match=r"pipeline plugin 'c' \(omni_plugin_c:register\) failed: needs foo"):
        load_entry_points([ep])


def test_discovery_imports_every_family_package(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_families"
    for family in ("alpha", "beta"):
        (pkg / family).mkdir(parents=True)
        (pkg / family / "__init__.py").write_text(
            "from omnistage.config import PipelineSpec, StageSpec, register_pipeline\n"
            f"register_pipeline('{family}_key', PipelineSpec(name='{family}', stages=(StageSpec(id=0, name='s', "
            "kind='ar', output='text', final_output=True),)))\n"
        )
    (pkg / "__init__.py").write_text("")
    (pkg / "not_a_family.py").write_text("raise RuntimeError('plain modules are not families')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry_mod, "FAMILY_PACKAGE", "fake_families")
    monkeypatch.setattr(registry_mod.REGISTRY, "_discovered", False)
    keys = registered_pipelines()
    assert {"alpha_key", "beta_key"} <= set(keys)


def test_real_families_are_discovered():
    keys = set(registered_pipelines())
    assert {"ZImagePipeline", "QwenImagePipeline", "QwenImageEditPipeline", "FluxPipeline",
            "StableDiffusion3Pipeline", "WanPipeline", "WanImageToVideoPipeline", "qwen2",
            "Qwen2ForCausalLM", "*ForCausalLM"} <= keys


# --- platform detection -----------------------------------------------------------------


def test_platform_without_driver_does_not_import_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(platform_mod, "_may_have_accelerator", lambda: False)
    assert platform_mod.detect_platform() == "cpu"
    assert "torch" not in sys.modules


def fake_torch(cuda=False, hip=None, mps=False):
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_available=lambda: cuda),
        version=types.SimpleNamespace(hip=hip),
        backends=types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: mps)),
    )


@pytest.mark.parametrize(
    "torch, expected",
    [(fake_torch(cuda=True), "cuda"), (fake_torch(cuda=True, hip="6.0"), "rocm"), (fake_torch(mps=True), "mps"),
     (fake_torch(), "cpu")],
)
def test_platform_asks_an_imported_torch(monkeypatch, torch, expected):
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert platform_mod.detect_platform() == expected
