"""Precedence: pipeline defaults < deploy file < platform overlay < --stage-overrides; hard wins."""

from __future__ import annotations

import logging

import pytest
from config_helpers import stage, three_stage

from omnistage.config import PipelineSpec, build_effective_config, load_deploy_config
from omnistage.config.deploy import BUNDLED_DIR


def spec_with(defaults=None, hard=None) -> PipelineSpec:
    return PipelineSpec(
        name="p",
        stages=(
            stage(0, "a", defaults=defaults or {}, hard=hard or {}),
            stage(1, "b", inputs=(0,), final_output=True),
        ),
    )


def test_no_deploy_gives_pipeline_defaults_over_field_defaults():
    cfg = build_effective_config(spec_with(defaults={"max_num_seqs": 3}), platform="cpu")
    assert cfg.stage_config(0).max_num_seqs == 3
    assert cfg.stage_config(1).max_num_seqs == 1
    assert cfg.platform == "cpu" and cfg.deploy_file is None
    assert cfg.pipeline_config.connector == "inline"


def test_precedence_chain(write_yaml):
    deploy = load_deploy_config(
        write_yaml(
            "d.yaml",
            {
                "stages": [
                    {"id": "*", "dtype": "float16", "compile": True},
                    {"id": 0, "max_num_seqs": 4, "dtype": "bfloat16", "request_batch_max_wait_ms": 7},
                ],
                "platforms": {
                    "cpu": {"stages": [{"id": "*", "dtype": "float32"}, {"id": 0, "max_num_seqs": 2}]},
                    "cuda": {"stages": [{"id": 1, "max_num_seqs": 16}]},
                },
            },
        )
    )
    spec = spec_with(defaults={"max_num_seqs": 3, "attention_backend": "flash", "request_batch_max_wait_ms": 1})
    cpu = build_effective_config(spec, deploy, platform="cpu", stage_overrides='{"0": {"max_num_seqs": 5}}')
    s0, s1 = cpu.stage_config(0), cpu.stage_config(1)
    assert s0.attention_backend == "flash"  # pipeline default, nobody overrides
    assert s0.request_batch_max_wait_ms == 7.0  # file beats pipeline default
    assert s0.compile is True and s1.compile is True  # file "*"
    # The platform overlay beats the file, even the file's numbered entry with its "*".
    assert s0.dtype == "float32" and s1.dtype == "float32"
    assert s0.max_num_seqs == 5  # CLI beats overlay
    assert s1.max_num_seqs == 1

    cuda = build_effective_config(spec, deploy, platform="cuda", stage_overrides={"*": {"max_num_seqs": 9}})
    assert cuda.stage_config(0).dtype == "bfloat16"  # numbered entry beats "*" within a layer
    assert cuda.stage_config(1).dtype == "float16"
    assert cuda.stage_config(1).max_num_seqs == 9  # CLI "*" beats the cuda overlay's 16
    assert cuda.stage_config(0).max_num_seqs == 9


def test_numbered_cli_entry_beats_cli_star():
    cfg = build_effective_config(spec_with(), platform="cpu", stage_overrides='{"*": {"max_num_seqs": 2}, "1": {"max_num_seqs": 6}}')
    assert [cfg.stage_config(i).max_num_seqs for i in (0, 1)] == [2, 6]


def test_sampling_defaults_merge_across_layers(write_yaml):
    deploy = load_deploy_config(
        write_yaml("d.yaml", {"stages": [{"id": 0, "default_sampling_params": {"temperature": 0.7}}]})
    )
    spec = spec_with(defaults={"default_sampling_params": {"top_k": 20, "temperature": 1.0}})
    cfg = build_effective_config(spec, deploy, platform="cpu",
                                 stage_overrides='{"0": {"default_sampling_params": {"top_p": 0.9}}}')
    assert cfg.stage_config(0).default_sampling_params == {"top_k": 20, "temperature": 0.7, "top_p": 0.9}


def test_pipeline_fields_with_platform_overlay(write_yaml):
    deploy = load_deploy_config(write_yaml("d.yaml", {"connector": "shm", "platforms": {"cpu": {"connector": "inline"}}}))
    assert build_effective_config(spec_with(), deploy, platform="cpu").pipeline_config.connector == "inline"
    assert build_effective_config(spec_with(), deploy, platform="cuda").pipeline_config.connector == "shm"


def test_hard_constraint_wins_and_warns(write_yaml, caplog):
    deploy = load_deploy_config(write_yaml("d.yaml", {"stages": [{"id": 0, "max_num_seqs": 4}]}))
    spec = spec_with(hard={"max_num_seqs": 1, "runtime": "inline"})
    with caplog.at_level(logging.WARNING, logger="omnistage.config.effective"):
        cfg = build_effective_config(spec, deploy, platform="cpu", stage_overrides='{"0": {"runtime": "process"}}')
    assert cfg.stage_config(0).max_num_seqs == 1
    assert cfg.stage_config(0).runtime == "inline"
    messages = [r.getMessage() for r in caplog.records]
    assert any("stage 0 (a): max_num_seqs=4 from" in m and "d.yaml" in m and "hard constraint max_num_seqs=1" in m
               for m in messages)
    assert any("runtime='process' from --stage-overrides" in m for m in messages)


def test_hard_constraint_agreeing_value_does_not_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="omnistage.config.effective"):
        cfg = build_effective_config(spec_with(hard={"max_num_seqs": 1}), platform="cpu",
                                     stage_overrides='{"0": {"max_num_seqs": 1}}')
    assert cfg.stage_config(0).max_num_seqs == 1
    assert not caplog.records


def test_layer_naming_a_missing_stage(write_yaml):
    deploy = load_deploy_config(write_yaml("d.yaml", {"stages": [{"id": 5, "max_num_seqs": 2}]}))
    with pytest.raises(ValueError) as info:
        build_effective_config(spec_with(), deploy, platform="cpu", stage_overrides='{"7": {}}')
    msg = str(info.value)
    assert "d.yaml: stage 5: pipeline 'p' has no such stage (stages: 0 (a), 1 (b))" in msg
    assert "--stage-overrides: stage 7: pipeline 'p' has no such stage" in msg


def test_parallel_mismatch_after_merge_names_stage_and_numbers(write_yaml):
    deploy = load_deploy_config(write_yaml("d.yaml", {"stages": [{"id": 0, "num_devices": 2, "executor": "mp"}]}))
    with pytest.raises(ValueError) as info:
        build_effective_config(spec_with(), deploy, platform="cpu",
                               stage_overrides='{"0": {"ulysses_degree": 4}, "1": {"vae_patch_parallel_size": 3}}')
    msg = str(info.value)
    assert "stage 0 (a): parallel degrees: cfg_parallel_size=1 * ulysses_degree=4 * ring_degree=1 * " \
           "tensor_parallel_size=1 * fsdp_degree=1 = 4, but num_devices=2" in msg
    assert "stage 1 (b): vae_patch_parallel_size=3 is more than num_devices=1" in msg


def test_unknown_platform():
    with pytest.raises(ValueError, match="unknown platform 'cdua'; did you mean 'cuda'"):
        build_effective_config(spec_with(), platform="cdua")


def test_platform_is_detected_when_not_given(monkeypatch):
    monkeypatch.setattr("omnistage.config.effective.detect_platform", lambda: "cuda")
    assert build_effective_config(spec_with()).platform == "cuda"


def test_to_dict_is_plain_data():
    cfg = build_effective_config(three_stage(), platform="cpu", stage_overrides='{"0": {"devices": ["cpu"]}}')
    data = cfg.to_dict()
    assert data["pipeline"]["stages"][1]["chunk_processor"] == "config_helpers.chunker"
    assert data["pipeline"]["stages"][2]["inputs"] == [1]
    assert data["stages"][0]["devices"] == ["cpu"]
    assert data["platform"] == "cpu"


@pytest.mark.parametrize(
    "name, spec",
    [
        ("qwen2_5_omni.yaml", three_stage()),
        (
            "csm.yaml",
            PipelineSpec(name="csm", stages=(stage(0, "talker"), stage(1, "codec", kind="generation", output="audio",
                                                                         inputs=(0,), final_output=True))),
        ),
    ],
)
@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_bundled_multi_stage_files_fit_their_topology(name, spec, platform):
    # The omni and CSM families are registered by their engine's issue; until then, check
    # the bundled files against stand-ins with the same stage ids.
    build_effective_config(spec, load_deploy_config(BUNDLED_DIR / name), platform=platform)
