"""SamplingParams: vLLM's field names, validation that names the field, no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omnistage.ar.sampling_params import SamplingParams


def test_defaults_follow_vllm():
    p = SamplingParams()
    assert (p.max_tokens, p.min_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (16, 0, 1.0, 1.0, 0, 0.0)
    assert (p.repetition_penalty, p.stop, p.stop_token_ids, p.seed, p.ignore_eos) == (1.0, [], [], None, False)
    assert not p.is_greedy
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(top_k=1).is_greedy


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("max_tokens", 1.5), ("min_tokens", -1), ("temperature", -0.1), ("top_p", 0.0),
    ("top_p", 1.5), ("top_k", -2), ("min_p", 1.1), ("repetition_penalty", 0.0), ("stop", [""]),
    ("stop_token_ids", [-1]), ("seed", 1.5), ("ignore_eos", "yes"),
])
def test_out_of_range_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_cross_field_rule_names_both():
    with pytest.raises(ValueError, match=r"min_tokens \(8\).*max_tokens \(4\)"):
        SamplingParams(max_tokens=4, min_tokens=8)


def test_every_problem_at_once():
    with pytest.raises(ValueError) as e:
        SamplingParams(temperature=-1, top_p=2)
    assert "temperature" in str(e.value) and "top_p" in str(e.value)


def test_normalisations():
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_from_dict_rejects_unknown_keys():
    assert SamplingParams.from_dict({"temperature": 0.5}).temperature == 0.5
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams.from_dict({"max_new_tokens": 3})


def test_import_does_not_pull_torch():
    code = ("import sys; from omnistage.ar import SamplingParams; import omnistage.ar.scheduler; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_deploy_defaults_fill_the_fields_a_request_leaves_out():
    # Field by field, as DiffusionParams: a request's own fields win, the rest come from the deploy.
    from omnistage.ar.sampling_params import admit

    deploy = SamplingParams.from_dict({"temperature": 0.7, "max_tokens": 100, "top_k": 5})
    merged = admit("r", SamplingParams(max_tokens=8, temperature=1.0), deploy, num_prompt=3, max_model_len=128)
    assert (merged.max_tokens, merged.temperature, merged.top_k) == (8, 1.0, 5)
    assert admit("r", None, deploy, num_prompt=3, max_model_len=128).temperature == 0.7


def test_problems_are_typed_errors_naming_their_fields():
    from omnistage.core.errors import RequestErrors

    with pytest.raises(RequestErrors) as e:
        SamplingParams(top_p=0, stop_token_ids=5)
    assert [err.param for err in e.value.errors] == ["top_p", "stop_token_ids"]
    assert "top_p" in str(e.value) and "stop_token_ids" in str(e.value)
