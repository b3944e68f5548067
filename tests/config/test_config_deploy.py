"""Deploy files: parsing, errors that name file/stage/key, base_config inheritance, overrides."""

from __future__ import annotations

import pytest

from omnistage.config import ALL_STAGES, DeployConfig, load_deploy_config, parse_stage_overrides
from omnistage.config.deploy import BUNDLED_DIR


def load_error(path) -> str:
    with pytest.raises(ValueError) as info:
        load_deploy_config(path)
    return str(info.value)


def test_full_file(write_yaml):
    path = write_yaml(
        "d.yaml",
        {
            "pipeline": "QwenImagePipeline",
            "connector": "shm",
            "stages": [{"id": "*", "dtype": "bfloat16"}, {"id": 0, "max_num_seqs": 4, "devices": ["cuda:0"]}],
            "platforms": {"cpu": {"connector": "inline", "stages": [{"id": 0, "dtype": "float32"}]}},
        },
    )
    cfg = load_deploy_config(path)
    assert cfg.path == path and cfg.pipeline == "QwenImagePipeline"
    assert cfg.body.pipeline_fields == {"connector": "shm"}
    assert cfg.body.stage_fields == {ALL_STAGES: {"dtype": "bfloat16"}, 0: {"max_num_seqs": 4, "devices": ("cuda:0",)}}
    assert cfg.body.fields_for(0) == {"dtype": "bfloat16", "max_num_seqs": 4, "devices": ("cuda:0",)}
    assert cfg.body.fields_for(1) == {"dtype": "bfloat16"}
    assert cfg.platforms["cpu"].stage_fields == {0: {"dtype": "float32"}}
    assert cfg.pipeline_config("cpu").connector == "inline"
    assert cfg.pipeline_config("cuda").connector == "shm"
    assert [layer.origin for layer in cfg.layers("cpu")] == [str(path), f"{path} platforms.cpu"]
    assert len(cfg.layers("cuda")) == 1


def test_empty_file_and_empty_config(write_yaml):
    cfg = load_deploy_config(write_yaml("empty.yaml", ""))
    assert cfg.pipeline is None and cfg.body.stage_fields == {} and cfg.platforms == {}
    assert DeployConfig(path=None).pipeline_config("cpu").connector == "inline"


def test_typo_in_stage_names_file_stage_and_key(write_yaml):
    path = write_yaml("d.yaml", {"stages": [{"id": 0, "max_num_seq": 4}]})
    msg = load_error(path)
    assert f"{path}: stage 0: unknown key 'max_num_seq'; did you mean 'max_num_seqs'?" in msg


def test_bad_values_name_file_stage_and_key(write_yaml):
    path = write_yaml(
        "d.yaml",
        {"stages": [{"id": 1, "max_num_seqs": 0, "executor": "rya"}], "platforms": {"cuda": {"stages": [{"id": 1, "dtype": "fp8"}]}}},
    )
    msg = load_error(path)
    assert f"{path}: stage 1: max_num_seqs: must be >= 1, got 0" in msg
    assert f"{path}: stage 1: executor: 'rya' is not one of uni|mp|ray; did you mean 'ray'?" in msg
    assert f"{path} platforms.cuda: stage 1: dtype: 'fp8' is not one of" in msg


def test_unknown_top_level_keys(write_yaml):
    msg = load_error(write_yaml("d.yaml", {"conector": "shm", "max_num_seqs": 2, "platfroms": {}}))
    assert "unknown key 'conector'; did you mean 'connector'?" in msg
    assert "'max_num_seqs' is a per-stage field: set it in a `stages:` entry" in msg
    assert "unknown key 'platfroms'; did you mean 'platforms'?" in msg


def test_unknown_platform_and_overlay_keys(write_yaml):
    msg = load_error(write_yaml("d.yaml", {"platforms": {"cdua": {}, "cpu": {"pipeline": "x", "stages": "no"}}}))
    assert "unknown platform 'cdua'; did you mean 'cuda'?" in msg
    assert "platforms.cpu: unknown key 'pipeline'" in msg
    assert "platforms.cpu: stages: expected a list of entries" in msg


@pytest.mark.parametrize(
    "stages, message",
    [
        ([{"max_num_seqs": 2}], "stages[0]: expected a mapping with an `id:`"),
        ([{"id": "zero"}], "stages[0]: id 'zero' is not a stage id or '*'"),
        ([{"id": -1}], "stages[0]: id -1 is not a stage id"),
        ([{"id": 0}, {"id": 0}], "stage 0: listed twice under stages:"),
        ({"0": {}}, "stages: expected a list of entries"),
    ],
)
def test_bad_stage_entries(write_yaml, stages, message):
    assert message in load_error(write_yaml("d.yaml", {"stages": stages}))


def test_yaml_syntax_and_shape_errors(write_yaml, tmp_path):
    assert "not valid YAML" in load_error(write_yaml("bad.yaml", "stages: [\n"))
    assert "expected a mapping at the top level, got list" in load_error(write_yaml("list.yaml", "- 1\n"))
    assert "no such file" in load_error(tmp_path / "missing.yaml")
    assert "pipeline: expected a registry key string" in load_error(write_yaml("p.yaml", {"pipeline": 3}))


# --- inheritance --------------------------------------------------------------------------


def test_base_config_relative_path_and_deep_merge(write_yaml):
    write_yaml(
        "bases/base.yaml",
        {
            "connector": "shm",
            "shm_threshold_bytes": 1024,
            "stages": [
                {"id": 0, "max_num_seqs": 2, "dtype": "float16",
                 "default_sampling_params": {"num_inference_steps": 20, "guidance_scale": 4.0},
                 "cache_backend": "tea_cache", "cache_config": {"rel_l1_thresh": 0.2}},
                {"id": 1, "max_num_seqs": 3},
            ],
            "platforms": {"cuda": {"stages": [{"id": 0, "compile": True}]}},
        },
    )
    # Relative to the including file's own folder.
    write_yaml("bases/mid.yaml", {"base_config": "base.yaml", "pipeline": "FluxPipeline"})
    child = write_yaml(
        "child.yaml",
        {
            "base_config": "bases/mid.yaml",
            "shm_threshold_bytes": 4096,
            "stages": [
                {"id": 0, "max_num_seqs": 8,
                 "default_sampling_params": {"guidance_scale": 3.5},
                 "cache_backend": "first_block_cache", "cache_config": {"threshold": 0.1}},
            ],
            "platforms": {"cuda": {"stages": [{"id": 0, "dtype": "bfloat16"}]}, "cpu": {"connector": "inline"}},
        },
    )
    cfg = load_deploy_config(child)
    assert cfg.path == child
    assert cfg.pipeline == "FluxPipeline"  # inherited
    assert cfg.body.pipeline_fields == {"connector": "shm", "shm_threshold_bytes": 4096}
    assert cfg.body.stage_fields[0] == {
        "max_num_seqs": 8,
        "dtype": "float16",
        # sampling defaults merge key by key ...
        "default_sampling_params": {"num_inference_steps": 20, "guidance_scale": 3.5},
        # ... a cache config belongs to its backend and is replaced whole.
        "cache_backend": "first_block_cache",
        "cache_config": {"threshold": 0.1},
    }
    assert cfg.body.stage_fields[1] == {"max_num_seqs": 3}
    assert cfg.platforms["cuda"].stage_fields[0] == {"compile": True, "dtype": "bfloat16"}
    assert cfg.platforms["cpu"].pipeline_fields == {"connector": "inline"}


def test_child_pipeline_key_wins(write_yaml):
    write_yaml("base.yaml", {"pipeline": "A"})
    assert load_deploy_config(write_yaml("c.yaml", {"base_config": "base.yaml", "pipeline": "B"})).pipeline == "B"


def test_base_config_absolute_path(write_yaml, tmp_path):
    base = write_yaml("elsewhere/base.yaml", {"connector": "ray"})
    child = write_yaml("sub/child.yaml", {"base_config": str(base)})
    assert load_deploy_config(child).body.pipeline_fields == {"connector": "ray"}


def test_base_config_bundled(write_yaml):
    child = write_yaml("child.yaml", {"base_config": "bundled:qwen_image.yaml", "stages": [{"id": 0, "max_num_seqs": 6}]})
    cfg = load_deploy_config(child)
    assert cfg.body.stage_fields[0]["max_num_seqs"] == 6
    assert cfg.body.stage_fields[0]["request_batch_max_wait_ms"] == 10.0  # from the bundled file
    assert "cpu" in cfg.platforms


def test_base_config_cycle(write_yaml):
    write_yaml("a.yaml", {"base_config": "b.yaml"})
    write_yaml("b.yaml", {"base_config": "c.yaml"})
    c = write_yaml("c.yaml", {"base_config": "a.yaml"})
    msg = load_error(c)
    assert "base_config cycle:" in msg
    assert "c.yaml -> " in msg and "a.yaml -> " in msg and "b.yaml -> " in msg


def test_base_config_self_cycle(write_yaml):
    assert "base_config cycle" in load_error(write_yaml("a.yaml", {"base_config": "a.yaml"}))


def test_missing_base_and_problems_in_every_file_at_once(write_yaml, tmp_path):
    assert f"{tmp_path / 'nope.yaml'}: no such file" in load_error(write_yaml("a.yaml", {"base_config": "nope.yaml"}))
    base = write_yaml("base.yaml", {"stages": [{"id": 0, "max_num_seq": 1}]})
    child = write_yaml("child.yaml", {"base_config": "base.yaml", "stages": [{"id": 0, "dtyp": "auto"}]})
    msg = load_error(child)
    assert f"{base}: stage 0: unknown key 'max_num_seq'" in msg
    assert f"{child}: stage 0: unknown key 'dtyp'; did you mean 'dtype'?" in msg


# --- --stage-overrides ------------------------------------------------------------------


def test_stage_overrides_json():
    layer = parse_stage_overrides('{"0": {"max_num_seqs": 4}, "*": {"dtype": "float32", "devices": ["cpu"]}}')
    assert layer.origin == "--stage-overrides"
    assert layer.stage_fields == {0: {"max_num_seqs": 4}, ALL_STAGES: {"dtype": "float32", "devices": ("cpu",)}}
    assert parse_stage_overrides(None).stage_fields == {}
    assert parse_stage_overrides({"1": {"compile": True}}).stage_fields == {1: {"compile": True}}


@pytest.mark.parametrize(
    "text, message",
    [
        ("{0: 1}", "--stage-overrides: not valid JSON"),
        ("[1]", "expected a JSON object"),
        ('{"zero": {}}', "stage key 'zero' is not a stage id or '*'"),
        ('{"0": 4}', "stage 0: expected an object of deploy fields"),
        ('{"0": {"max_num_seq": 4}}', "stage 0: unknown key 'max_num_seq'; did you mean 'max_num_seqs'?"),
        ('{"*": {"executor": "mpi"}}', "stage *: executor: 'mpi' is not one of uni|mp|ray"),
    ],
)
def test_stage_overrides_errors(text, message):
    with pytest.raises(ValueError) as info:
        parse_stage_overrides(text)
    assert message in str(info.value)


# --- bundled files ------------------------------------------------------------------------

BUNDLED = sorted(p.name for p in BUNDLED_DIR.glob("*.yaml"))


def test_bundled_files_exist():
    expected = {"base.yaml", "z_image.yaml", "qwen_image.yaml", "qwen_image_edit.yaml", "flux.yaml", "sd3.yaml",
                "wan.yaml", "llm.yaml", "qwen2_llm.yaml", "qwen2_5_omni.yaml", "csm.yaml"}
    assert expected <= set(BUNDLED)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_file_loads_and_validates(name):
    cfg = load_deploy_config(BUNDLED_DIR / name)
    assert cfg.pipeline is None  # bundled files never force a pipeline: detection decides
    for platform in ("cpu", "cuda"):
        cfg.pipeline_config(platform)
    if name != "base.yaml":
        # Every family file inherits base.yaml's pipeline-wide fields.
        assert cfg.body.pipeline_fields["connector"] == "inline"


def test_replica_devices_loads_from_yaml_and_a_bad_shape_names_file_stage_and_key(write_yaml):
    path = write_yaml("d.yaml", {"stages": [{"id": 0, "runtime": "process", "num_replicas": 2,
                                             "replica_devices": [["cuda:0"], ["cuda:1"]]}]})
    assert load_deploy_config(path).body.fields_for(0)["replica_devices"] == (("cuda:0",), ("cuda:1",))
    bad = write_yaml("bad.yaml", {"stages": [{"id": 0, "replica_devices": ["cuda:0", "cuda:1"]}]})
    assert f"{bad}: stage 0: replica_devices: expected list of list of string" in load_error(bad)
