"""LoRA on the zoo's Z-Image with the zoo's tiny LoRA builder: static (fused at load) and per
request (chosen by name) both equal diffusers' `load_lora_weights` on the reference pipeline
with the same seed; scale 0 is the base model; different adapters never share a call."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.diffusion.params import DiffusionParams, LoraRequest
from omnistage.testing.lora import build_lora

from accel_common import call_kwargs, load, run
from parity import TOLERANCE, load_reference, max_abs_diff, reference_arrays, request_for

NAME = "z-image"


@pytest.fixture(scope="module")
def path(zoo):
    return zoo(NAME)


@pytest.fixture(scope="module")
def loras(path, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    return {name: str(build_lora(path, out / f"{name}.safetensors", seed=seed))
            for name, seed in (("style", 1), ("other", 2))}


@pytest.fixture(scope="module")
def reference(path, loras):
    import diffusers

    pipe = load_reference(diffusers.ZImagePipeline, path)
    for name, file in loras.items():
        pipe.load_lora_weights(file, adapter_name=name)
    return pipe


def expected(reference, adapter: str | None, scale: float = 1.0, seed: int = 3) -> np.ndarray:
    if adapter is None:
        reference.disable_lora()
    else:
        reference.enable_lora()
        reference.set_adapters([adapter], adapter_weights=[scale])
    return reference_arrays(reference, call_kwargs(NAME), seed)


@pytest.fixture(scope="module")
def per_request(path, loras):
    return load(NAME, path, lora_adapters=loras)


def lora_request(adapter: str | None, scale: float = 1.0, seed: int = 3, rid: str = "r"):
    request = request_for(call_kwargs(NAME), seed, rid)
    lora = None if adapter is None else LoraRequest(name=adapter, scale=scale)
    return request.__class__(rid, request.prompt, request.params.model_copy(update={"lora": lora}))


def test_static_lora_fused_at_load_matches_diffusers(path, loras, reference):
    ours = load(NAME, path, lora=[{"path": loras["style"], "scale": 0.7}])
    assert ours.accelerations == ["lora"]
    assert not any("lora" in n for n, _ in ours.transformer.named_modules())  # fused: no LoRA layers left
    want = expected(reference, "style", 0.7)
    assert max_abs_diff(run(ours, NAME), want) <= TOLERANCE
    assert max_abs_diff(want, expected(reference, None)) > 1e-2  # the adapter really changes the output


def test_per_request_adapters_match_diffusers_in_one_mixed_batch(per_request, reference):
    requests = [lora_request("style", 1.0, rid="a"), lora_request("other", 0.5, rid="b"),
                lora_request(None, rid="c"), lora_request("style", 0.0, rid="d")]
    got = per_request.decode_arrays(per_request.denoise(requests))
    base = expected(reference, None)
    assert max_abs_diff(got[0], expected(reference, "style", 1.0)) <= TOLERANCE
    assert max_abs_diff(got[1], expected(reference, "other", 0.5)) <= TOLERANCE
    assert max_abs_diff(got[2], base) <= TOLERANCE
    assert max_abs_diff(got[3], base) <= TOLERANCE  # scale 0 is the base model
    assert max_abs_diff(got[0], got[1]) > 1e-2


def test_step_mode_joiner_with_another_adapter(per_request, reference):
    # A "style" request runs 2 steps alone, then an "other" request joins; each step groups them by adapter.
    states = per_request.encode([per_request.prepare_request(lora_request("style", rid="a", seed=5))])
    per_request.step(states)
    states += per_request.encode([per_request.prepare_request(lora_request("other", 0.5, rid="b", seed=6))])
    while any(not s.is_done for s in states):
        per_request.step([s for s in states if not s.is_done])
    got = per_request.decode_arrays(states)
    assert max_abs_diff(got[0], expected(reference, "style", 1.0, seed=5)) <= TOLERANCE
    assert max_abs_diff(got[1], expected(reference, "other", 0.5, seed=6)) <= TOLERANCE


def test_different_adapters_never_share_a_transformer_call(per_request):
    calls = []
    handle = per_request.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append(per_request.step_runner.active), with_kwargs=True)
    try:
        per_request.denoise([lora_request("style", rid="a"), lora_request("other", rid="b"),
                             lora_request("style", rid="c")])
    finally:
        handle.remove()
    assert set(calls) == {("style", 1.0), ("other", 1.0)}
    keys = {per_request.batch_key(per_request.prepare_params(r.params)) for r in
            (lora_request("style"), lora_request("other"), lora_request("style", 0.5), lora_request(None))}
    assert len(keys) == 4


def test_unknown_adapter_is_refused_naming_it(per_request, path):
    with pytest.raises(ValueError, match=r"lora.name: unknown adapter 'nope'; this model serves: other, style"):
        per_request.prepare_params(DiffusionParams(lora=LoraRequest(name="nope")))
    plain = load(NAME, path)
    with pytest.raises(ValueError, match=r"unknown adapter 'style'; this model serves: none"):
        plain.prepare_params(DiffusionParams(lora={"name": "style"}))


def test_bad_static_entry_and_missing_file_are_named(path, tmp_path):
    with pytest.raises(ValueError, match=r"lora: item 0: expected \{path: string, scale: number\}"):
        load(NAME, path, lora=[{"file": "x"}])
    with pytest.raises(ValueError, match=r"lora: cannot load adapter 'a' from .*missing.safetensors"):
        load(NAME, path, lora_adapters={"a": str(tmp_path / "missing.safetensors")})
