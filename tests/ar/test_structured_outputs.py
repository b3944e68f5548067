"""Logprobs and grammar masks in the AR engine, on the zoo's tiny random qwen2-llm."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from ar_helpers import PROMPTS, final, make_engine, run
from omnistage.ar.sampling_params import SamplingParams
from omnistage.ar.structured_outputs import StructuredOutputsParams
from omnistage.core.types import StageRequest

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(llm_path):
    eng = make_engine(llm_path, max_num_seqs=8)
    yield eng
    eng.close()


def _check_schema(value) -> None:
    assert set(value) == {"name", "age", "pet"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 6
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 120
    assert value["pet"] in ("cat", "dog")


def test_logprobs_are_the_processed_distribution(engine, hf_model, tokenizer):
    ids = tokenizer(PROMPTS[0])["input_ids"]
    out = final(run(engine, [StageRequest("lp", {"prompt_token_ids": ids},
                                          SamplingParams(max_tokens=4, temperature=0.0, logprobs=3))]), "lp")
    assert len(out.logprobs) == len(out.token_ids) == 4
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids + out.token_ids[:-1]])).logits[0, len(ids) - 1:].float()
    expected = logits.log_softmax(-1)
    for i, entry in enumerate(out.logprobs):
        assert entry.token_id == out.token_ids[i]
        assert math.isclose(entry.logprob, expected[i, entry.token_id].item(), abs_tol=1e-4)
        assert [t for t, _, _ in entry.top] == expected[i].topk(3).indices.tolist()
        assert entry.top[0][0] == entry.token_id  # greedy: the sampled token is the most likely
        assert entry.token == tokenizer.decode([entry.token_id])


def test_logprobs_stream_as_deltas_and_follow_temperature(engine):
    params = SamplingParams(max_tokens=6, temperature=0.5, seed=3, logprobs=0, ignore_eos=True)
    outs = run(engine, [StageRequest("t", PROMPTS[1], params)])["t"]
    streamed = [lp for o in outs for lp in o.payload.delta_logprobs]
    assert [lp.token_id for lp in streamed] == outs[-1].payload.token_ids
    assert streamed == outs[-1].payload.logprobs and all(lp.top == [] for lp in streamed)
    assert all(lp.logprob <= 0 for lp in streamed)


def test_json_schema_outputs_always_validate_batched_with_free_requests(engine):
    schema = StructuredOutputsParams(json=SCHEMA)
    requests = [StageRequest(f"s{i}", PROMPTS[i % 4], SamplingParams(max_tokens=64, temperature=1.0, seed=i,
                                                                      structured_outputs=schema))
                for i in range(6)]
    requests += [StageRequest(f"free{i}", PROMPTS[i], SamplingParams(max_tokens=12, temperature=1.0, seed=i))
                 for i in range(2)]
    outputs = run(engine, requests)
    for i in range(6):
        out = final(outputs, f"s{i}")
        assert out.finish_reason == "stop", out.text
        _check_schema(json.loads(out.text))
    free = [final(outputs, f"free{i}").text for i in range(2)]
    assert not all(_parses(t) for t in free)  # the unconstrained rows were not masked


def _parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def test_json_object_output_is_an_object_so_far(engine):
    # Free-form JSON on random weights rarely closes its strings: check what it wrote parses
    # once stopped, and is an object's start when the length cap cut it.
    spec = StructuredOutputsParams(json_object=True)
    outputs = run(engine, [StageRequest(f"o{i}", PROMPTS[i], SamplingParams(max_tokens=40, seed=i,
                                                                            structured_outputs=spec))
                           for i in range(3)])
    for i in range(3):
        out = final(outputs, f"o{i}")
        assert out.text.startswith("{")
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict)


@pytest.mark.parametrize("spec, check", [
    (StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}"), lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
    (StructuredOutputsParams(choice=["yes", "no", "maybe"]), lambda t: t in ("yes", "no", "maybe")),
])
def test_other_grammars(engine, spec, check):
    requests = [StageRequest(f"g{i}", PROMPTS[i], SamplingParams(max_tokens=200, seed=i, structured_outputs=spec))
                for i in range(3)]
    outputs = run(engine, requests)
    for i in range(3):
        out = final(outputs, f"g{i}")
        assert out.finish_reason == "stop" and check(out.text), out.text


def test_bad_grammars_and_params_are_rejected_at_add(engine):
    with pytest.raises(ValueError, match="structured_outputs.regex"):
        engine.add_request(StageRequest("bad", "x", SamplingParams(structured_outputs={"regex": "(("})))
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["b"]})
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=2, structured_outputs={"json_object": True})
    assert not engine.has_unfinished_requests()
