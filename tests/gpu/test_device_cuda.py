"""CUDA device handling: a bare "cuda" is the current device everywhere (a diffusion stage on
`devices: [cuda]` starts, which `torch.cuda.set_device` with an index-less device did not),
`from_pretrained(deploy=...)` loads on the deploy's device and dtype, and an in-process stage
leaves the process's current device as it found it (`device_scope`)."""

from __future__ import annotations

import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.device import canonical_device, device_scope, resolve_device

from accel_common import load

pytestmark = pytest.mark.gpu


def test_bare_cuda_resolves_to_the_current_device():
    assert canonical_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    assert resolve_device(("cuda",)).index == torch.cuda.current_device()


def test_from_pretrained_honours_the_deploy_device_and_dtype(zoo):
    pipeline = load("z-image", str(zoo("z-image")), devices=["cuda"], dtype="bfloat16")
    weight = next(pipeline.transformer.parameters())
    assert pipeline.device.type == "cuda" and weight.is_cuda and weight.dtype == torch.bfloat16


def test_a_stage_on_bare_cuda_runs_and_keeps_the_current_device(zoo):
    from omnistage.diffusion.engine import DiffusionEngine
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.core.types import StageRequest

    before = torch.cuda.current_device()
    config = StageDeployConfig(devices=("cuda",), dtype="bfloat16")
    with DiffusionEngine(str(zoo("z-image")), config=config) as engine:
        engine.add_request(StageRequest("r0", "a cat", DiffusionParams(seed=0, num_inference_steps=2, height=32,
                                                                        width=32)))
        outs = []
        while engine.has_unfinished_requests():
            outs += [out for out in engine.step() if out.finished]
    assert outs and outs[0].error is None, outs
    assert torch.cuda.current_device() == before


def test_device_scope_sets_and_restores_the_current_device():
    last = torch.cuda.device_count() - 1
    before = torch.cuda.current_device()
    with device_scope(f"cuda:{last}"):
        assert torch.cuda.current_device() == last
        assert torch.empty(1, device="cuda").device.index == last
    assert torch.cuda.current_device() == before
