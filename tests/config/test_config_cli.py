"""`omnistage config show` on fake model folders (and on the zoo, when it has models)."""

from __future__ import annotations


import pytest
import yaml

from omnistage.config.deploy import BUNDLED_DIR
from omnistage.entrypoints.cli import main


def show(capsys, *argv) -> tuple[int, dict | None, str]:
    code = main(["config", "show", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, (yaml.safe_load(out) if code == 0 else None), err


def test_show_diffusers_family_with_bundled_default(capsys, make_model):
    model = make_model(model_index={"_class_name": "QwenImagePipeline"})
    code, data, _ = show(capsys, model, "--platform", "cuda")
    assert code == 0
    assert data["model"] == str(model)
    assert data["pipeline"]["key"] == "QwenImagePipeline"
    assert data["pipeline"]["resolved_by"] == "model_index.json _class_name"
    assert data["pipeline"]["stages"][0]["kind"] == "diffusion"
    assert data["deploy_file"] == str(BUNDLED_DIR / "qwen_image.yaml")
    assert data["platform"] == "cuda"
    assert data["pipeline_config"]["connector"] == "inline"
    assert data["stages"][0]["max_num_seqs"] == 2
    assert data["stages"][0]["request_batch_max_wait_ms"] == 10.0


def test_show_applies_platform_overlay_and_overrides(capsys, make_model):
    model = make_model(model_index={"_class_name": "QwenImagePipeline"})
    code, data, _ = show(capsys, model, "--platform", "cpu", "--stage-overrides", '{"*": {"dtype": "float32"}}')
    assert code == 0
    assert data["stages"][0]["max_num_seqs"] == 4  # cpu overlay
    assert data["stages"][0]["dtype"] == "float32"


def test_show_with_user_deploy_file(capsys, make_model, write_yaml):
    model = make_model(config={"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    deploy = write_yaml("d.yaml", {"base_config": "bundled:qwen2_llm.yaml", "stages": [{"id": 0, "max_model_len": 2048}]})
    code, data, _ = show(capsys, model, "--deploy-config", deploy, "--platform", "cuda")
    assert code == 0
    assert data["deploy_file"] == str(deploy)
    assert data["stages"][0]["max_model_len"] == 2048
    assert data["stages"][0]["max_num_seqs"] == 8  # from the bundled llm.yaml via qwen2_llm.yaml
    assert data["pipeline"]["stages"][0]["output"] == "text"


def test_show_errors_are_one_line_per_problem(capsys, make_model, write_yaml):
    model = make_model(model_index={"_class_name": "FluxPipeline"})
    deploy = write_yaml("d.yaml", {"stages": [{"id": 0, "max_num_seq": 4}]})
    code, _, err = show(capsys, model, "--deploy-config", deploy)
    assert code == 2
    assert "stage 0: unknown key 'max_num_seq'; did you mean 'max_num_seqs'?" in err
    code, _, err = show(capsys, model, "--stage-overrides", '{"0": {"num_devices": 2, "executor": "mp"}}', "--platform", "cpu")
    assert code == 2
    assert "stage 0 (diffusion): parallel degrees:" in err and "= 1, but num_devices=2" in err
    code, _, err = show(capsys, make_model("unknown", config={"model_type": "nope"}))
    assert code == 2 and "no pipeline for model" in err and "Registered:" in err


@pytest.mark.slow
def test_show_every_zoo_model(capsys, zoo):
    # One test looping over the zoo, not a parametrized one: listing the zoo imports
    # torch, which collection of these fast tests should not pay for.
    from omnistage.testing import list_models

    models = list_models()
    assert models
    failures = []
    for model in models:
        code, data, err = show(capsys, zoo(model.name), "--platform", "cpu")
        if code != 0:
            failures.append(f"{model.name}: {err}")
        else:
            # Resolved by the model_type (or VoxCPM's single `architecture` name), or else by the
            # name of the class that loads it.
            key, rule = data["pipeline"]["key"], data["pipeline"]["resolved_by"]
            by_name = rule in ("config.json model_type", "config.json architecture")
            if not by_name and key != model.reference_class.rsplit(".", 1)[-1]:
                failures.append(f"{model.name}: resolved to {key} by {rule}, expected {model.reference_class}")
    assert not failures, "\n".join(failures)
