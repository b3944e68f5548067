"""`offload`: model (one component on the device at a time) and layerwise (transformer blocks
a group at a time, through diffusers' group offloading) give the plain run's output exactly,
and a hook that records where each module runs sees it on the execution device while every
other component waits on the CPU. On CPU the two devices are one, so the placement half of
these tests means something on a GPU (the same tests run there, see scripts/device_check.sh)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel_common import load, run

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def device_of(module: torch.nn.Module) -> str:
    return next(module.parameters()).device.type


def record_placement(pipeline) -> list[tuple[str, str, dict[str, str]]]:
    """(component, where it ran, where every other component was) for each run of a component:
    hooks on its leaf layers fire once the offload hooks have moved the weights."""
    log: list[tuple[str, str, dict[str, str]]] = []
    modules = {n: c for n, c in pipeline.components.items() if isinstance(c, torch.nn.Module)}

    def record(layer, args, name):
        if not log or log[-1][0] != name:
            log.append((name, device_of(layer), {o: device_of(c) for o, c in modules.items() if o != name}))

    for name, module in modules.items():
        for layer in module.modules():
            if next(layer.children(), None) is None and next(layer.parameters(), None) is not None:
                layer.register_forward_pre_hook(lambda m, args, name=name: record(m, args, name))
    return log


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


@pytest.fixture(scope="module")
def plain(path):
    return run(load("z-image", path, devices=[DEVICE]), "z-image")


def test_model_offload_is_exact_and_one_component_is_resident(path, plain):
    ours = load("z-image", path, devices=[DEVICE], offload="model")
    assert ours.accelerations == ["offload"]
    log = record_placement(ours)
    np.testing.assert_array_equal(run(ours, "z-image"), plain)
    ran = [name for name, _, _ in log]
    assert ran == ["text_encoder", "transformer", "vae"]
    for name, where, others in log:
        assert where == ours.device.type, name
        assert set(others.values()) == {"cpu"}, (name, others)


@pytest.mark.parametrize("blocks_per_group", [1, 2])
def test_layerwise_offload_is_exact_and_moves_blocks_a_group_at_a_time(path, plain, blocks_per_group):
    ours = load("z-image", path, devices=[DEVICE], offload="layerwise", offload_blocks_per_group=blocks_per_group)
    blocks = ours.transformer.layers
    seen = []
    for i, block in enumerate(blocks):
        leaf = next(m for m in block.modules() if isinstance(m, torch.nn.Linear))
        leaf.register_forward_pre_hook(lambda m, args, i=i: seen.append(
            (i, [device_of(b) for b in blocks], device_of(ours.text_encoder))))
    np.testing.assert_array_equal(run(ours, "z-image"), plain)
    assert {i for i, _, _ in seen} == set(range(len(blocks)))
    for i, where, text_encoder in seen:
        group = i // blocks_per_group
        on_device = {j for j, d in enumerate(where) if d == ours.device.type}
        assert i in on_device and text_encoder == "cpu"
        if ours.device.type != "cpu":  # only this group (and the prefetched next) is resident
            assert on_device <= {j for j in range(len(blocks)) if j // blocks_per_group in (group, group + 1)}


def test_unknown_mode_is_refused(path):
    with pytest.raises(ValueError, match="offload: 'disk' is not one of model|layerwise"):
        load("z-image", path, offload="disk")
