"""StageDeployConfig / PipelineDeployConfig: types, ranges, choices, parallel degrees."""

from __future__ import annotations

import pytest

from omnistage.config import PipelineDeployConfig, StageDeployConfig
from omnistage.config.validation import closest, unknown_key


def test_defaults_are_valid_and_unchanged():
    cfg = StageDeployConfig()
    assert (cfg.runtime, cfg.dtype, cfg.max_num_seqs, cfg.executor, cfg.num_devices) == ("inline", "auto", 1, "uni", 1)
    assert cfg.devices == () and cfg.cache_config == {} and cfg.default_sampling_params == {}
    assert PipelineDeployConfig() == PipelineDeployConfig(connector="inline", shm_threshold_bytes=65536)


def test_yaml_shapes_are_converted():
    cfg = StageDeployConfig(devices=["cuda:0", "cuda:1"], num_devices=2, executor="mp", tensor_parallel_size=2,
                            request_batch_max_wait_ms=5)
    assert cfg.devices == ("cuda:0", "cuda:1")
    assert cfg.request_batch_max_wait_ms == 5.0 and isinstance(cfg.request_batch_max_wait_ms, float)
    assert PipelineDeployConfig(output_modalities=["text"]).output_modalities == ("text",)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_num_seqs": 0}, "max_num_seqs: must be >= 1, got 0"),
        ({"max_num_seqs": True}, "max_num_seqs: expected integer, got boolean True"),
        ({"max_num_seqs": "4"}, "max_num_seqs: expected integer, got string '4'"),
        ({"executor": "mpi"}, "executor: 'mpi' is not one of uni|mp|ray; did you mean 'mp'?"),
        ({"dtype": "fp16"}, "dtype: 'fp16' is not one of auto|float32|bfloat16|float16"),
        ({"runtime": "thread"}, "runtime: 'thread' is not one of inline|process|ray"),
        ({"offload": "cpu"}, "offload: 'cpu' is not one of model|layerwise"),
        ({"ar_backend": "sglang"}, "ar_backend: 'sglang' is not one of native|vllm"),
        ({"request_batch_max_wait_ms": -1}, "request_batch_max_wait_ms: must be >= 0"),
        ({"max_model_len": 0}, "max_model_len: must be >= 1"),
        ({"devices": "cuda:0"}, "devices: expected list of string, got string 'cuda:0'"),
        ({"env": {"A": 1}}, "env: expected mapping of string to string"),
        ({"cache_config": []}, "cache_config: expected mapping"),
    ],
)
def test_stage_field_errors(kwargs, message):
    with pytest.raises(ValueError, match="invalid StageDeployConfig") as info:
        StageDeployConfig(**kwargs)
    assert message in str(info.value)


def test_optional_fields_accept_none():
    cfg = StageDeployConfig(offload=None, max_model_len=None, cache_backend=None, lora=None)
    assert cfg.offload is None


def test_every_field_problem_at_once():
    with pytest.raises(ValueError) as info:
        StageDeployConfig(max_num_seqs=0, executor="rya", dtype=3)
    msg = str(info.value)
    assert "max_num_seqs" in msg and "did you mean 'ray'" in msg and "dtype: expected string" in msg


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_devices": 2, "executor": "mp", "cfg_parallel_size": 2},
        {"num_devices": 8, "executor": "ray", "cfg_parallel_size": 2, "ulysses_degree": 2, "ring_degree": 2},
        {"num_devices": 4, "executor": "mp", "tensor_parallel_size": 4, "vae_patch_parallel_size": 4},
        {"num_devices": 2, "executor": "mp", "tensor_parallel_size": 2, "devices": ["cuda:0", "cuda:1"]},
    ],
)
def test_parallel_layouts_that_fit(kwargs):
    StageDeployConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"num_devices": 2, "executor": "mp", "cfg_parallel_size": 2, "ulysses_degree": 2},
            "cfg_parallel_size=2 * ulysses_degree=2 * ring_degree=1 * tensor_parallel_size=1 * fsdp_degree=1 = 4, "
            "but num_devices=2",
        ),
        ({"num_devices": 4, "executor": "mp", "ulysses_degree": 2}, "= 2, but num_devices=4"),
        ({"vae_patch_parallel_size": 2}, "vae_patch_parallel_size=2 is more than num_devices=1"),
        ({"devices": ["cuda:0", "cuda:1"]}, "devices lists 2 device(s) ['cuda:0', 'cuda:1'], but num_devices=1"),
        ({"num_devices": 2, "tensor_parallel_size": 2}, "executor 'uni' runs one in-process worker; num_devices=2"),
    ],
)
def test_parallel_layouts_that_do_not_fit(kwargs, message):
    with pytest.raises(ValueError) as info:
        StageDeployConfig(**kwargs)
    assert message in str(info.value)


def test_pipeline_field_errors():
    with pytest.raises(ValueError) as info:
        PipelineDeployConfig(connector="zmq", shm_threshold_bytes=-1, output_modalities=["text", "smell"])
    msg = str(info.value)
    assert "connector: 'zmq' is not one of inline|shm|ray" in msg
    assert "shm_threshold_bytes: must be >= 0" in msg
    assert "output_modalities: ['smell'] not in" in msg


def test_typo_suggestions():
    assert closest("max_num_seq", ["max_num_seqs", "num_devices"]) == "max_num_seqs"
    assert closest("zzz", ["max_num_seqs"]) is None
    assert unknown_key("max_num_seq", ["max_num_seqs"]) == "unknown key 'max_num_seq'; did you mean 'max_num_seqs'?"
    assert unknown_key("zzz", ["b", "a"]) == "unknown key 'zzz'; valid: a, b"
