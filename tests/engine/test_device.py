"""Device resolution: a bare "cuda" is the current CUDA device everywhere, an in-process
stage's device is current only inside its `device_scope`, and a Ray stage that needs a GPU
asks Ray for one and sees it renumbered from cuda:0. The CUDA side of each runs in
tests/gpu/test_device_cuda.py; here the CUDA queries are faked where the logic needs them."""

from __future__ import annotations

import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.runtime import ray as ray_utils
from omnistage.core.device import canonical_device, device_scope, resolve_device, resolve_devices, resolve_dtype


@pytest.fixture
def fake_cuda(monkeypatch):
    """A machine with 4 CUDA devices whose current one is cuda:2 (torch's queries only; nothing runs)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)


def test_bare_cuda_is_the_current_device(fake_cuda):
    assert canonical_device("cuda") == torch.device("cuda", 2)
    assert canonical_device(torch.device("cuda")) == torch.device("cuda", 2)
    assert canonical_device("cuda:1") == torch.device("cuda", 1)
    assert canonical_device("cpu") == torch.device("cpu")


def test_stage_devices_resolve_with_indices(fake_cuda):
    assert resolve_devices(("cuda",)) == (torch.device("cuda", 2),)
    assert resolve_devices(("cuda:0", "cuda:3"), 2) == (
        torch.device("cuda", 0), torch.device("cuda", 3))
    # No devices listed: from the current device on.
    assert resolve_devices((), 2) == (
        torch.device("cuda", 2), torch.device("cuda", 3))
    with pytest.raises(ValueError, match="num_devices=3 from cuda:2 but only 4 CUDA devices"):
        resolve_devices((), 3)
    assert resolve_device(()) == torch.device("cuda", 2)
    assert resolve_dtype("auto", torch.device("cuda", 2)) == torch.bfloat16


def test_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("checks a machine without CUDA")
    assert resolve_device(()) == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    # A Ray head without CUDA leaves a bare "cuda" for the actor that runs on it.
    assert canonical_device("cuda") == torch.device("cuda")


def test_device_scope_off_cuda_changes_nothing():
    with device_scope("cpu"):
        assert torch.empty(1).device.type == "cpu"


def test_ray_actor_asks_for_a_gpu_when_the_stage_needs_one():
    assert ray_utils.wants_gpu(("cuda:1",), cluster_gpus=0)
    assert not ray_utils.wants_gpu(("cpu",), cluster_gpus=8)
    # `devices: []` means the platform default: a GPU when the cluster has any, not the driver's CUDA.
    assert ray_utils.wants_gpu((), cluster_gpus=2)
    assert not ray_utils.wants_gpu((), cluster_gpus=0)
    config = StageDeployConfig()
    assert ray_utils.actor_resources(config, ray_utils.wants_gpu((), 2))["num_gpus"] == 1.0


def test_ray_actor_sees_its_gpus_from_cuda_0():
    assert ray_utils.devices_in_actor(("cuda:3",), 1, gpu=True) == ("cuda:0",)
    assert ray_utils.devices_in_actor(("cuda:5", "cuda:2"), 2, gpu=True) == ("cuda:0", "cuda:1")
    assert ray_utils.devices_in_actor((), 2, gpu=True) == ("cuda:0", "cuda:1")
    assert ray_utils.devices_in_actor((), 1, gpu=False) == ()
    assert ray_utils.devices_in_actor(("cpu",), 1, gpu=False) == ("cpu",)
