"""`offload`: model (one component on the device at a time) and layerwise (transformer blocks
a group at a time, through diffusers' group offloading) give the plain run's output exactly,
and a hook that records where each module runs sees it on the execution device while every
other component waits on the CPU. On CPU the two devices are one, so the device half of the
placement checks means something on a GPU only (the same tests run there, see
scripts/device_check.sh); on CPU the tests check the offload mechanism itself, which is absent
when offload does nothing: the component that runs is the one the offload hooks brought to the
device (model), and diffusers onloads every block group before its blocks run (layerwise)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel_common import load, run

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def device_of(module: torch.nn.Module) -> str:
    return next(module.parameters()).device.type


def record_placement(pipeline) -> list[tuple[str, str, dict[str, str], str | None]]:
    """(component, where it ran, where every other component was, which component the offload
    hooks hold on the device) for each run of a component: hooks on its leaf layers fire once the
    offload hooks have moved the weights."""
    log: list[tuple[str, str, dict[str, str], str | None]] = []
    modules = {n: c for n, c in pipeline.components.items() if isinstance(c, torch.nn.Module)}
    name_of = {id(c): n for n, c in modules.items()}

    def record(layer, args, name):
        if not log or log[-1][0] != name:
            residency = getattr(pipeline, "offload_residency", None)
            held = name_of.get(id(residency.current)) if residency is not None else None
            log.append((name, device_of(layer), {o: device_of(c) for o, c in modules.items() if o != name}, held))

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
    # Offload leaves the transformer's linears unpacked (accel/prepack.py), so must the run it equals.
    return run(load("z-image", path, devices=[DEVICE], prepack_linears=False), "z-image")


def test_model_offload_is_exact_and_one_component_is_resident(path, plain):
    ours = load("z-image", path, devices=[DEVICE], offload="model")
    assert ours.accelerations == ["offload"]
    log = record_placement(ours)
    np.testing.assert_array_equal(run(ours, "z-image"), plain)
    ran = [name for name, _, _, _ in log]
    assert ran == ["text_encoder", "transformer", "vae"]
    for name, where, others, held in log:
        assert held == name  # the offload hook brought it (and so sent the previous one back)
        assert where == ours.device.type, name
        assert set(others.values()) == {"cpu"}, (name, others)


@pytest.mark.parametrize("blocks_per_group", [1, 2])
def test_layerwise_offload_is_exact_and_moves_blocks_a_group_at_a_time(path, plain, blocks_per_group, monkeypatch):
    from diffusers.hooks.group_offloading import ModuleGroup

    ours = load("z-image", path, devices=[DEVICE], offload="layerwise", offload_blocks_per_group=blocks_per_group)
    blocks = ours.transformer.layers
    index_of = {id(b): i for i, b in enumerate(blocks)}
    events: list[tuple[str, tuple[int, ...]]] = []  # ("onload", the group's blocks) / ("run", (block,))
    onload = ModuleGroup.onload_

    def spy_onload(group):
        events.append(("onload", tuple(sorted(index_of[id(m)] for m in group.modules if id(m) in index_of))))
        return onload(group)

    monkeypatch.setattr(ModuleGroup, "onload_", spy_onload)
    seen = []

    def record(i):
        events.append(("run", (i,)))
        seen.append((i, [device_of(b) for b in blocks], device_of(ours.text_encoder)))

    for i, block in enumerate(blocks):
        leaf = next(m for m in block.modules() if isinstance(m, torch.nn.Linear))
        leaf.register_forward_pre_hook(lambda m, args, i=i: record(i))
    np.testing.assert_array_equal(run(ours, "z-image"), plain)
    assert {i for i, _, _ in seen} == set(range(len(blocks)))
    # every block runs right after its own group (and only it) was onloaded
    groups = [g for kind, g in events if kind == "onload" and g]
    assert groups and all(g == tuple(range(g[0], min(g[0] + blocks_per_group, len(blocks)))) for g in groups)
    last_group = None
    for kind, g in events:
        if kind == "onload" and g:
            last_group = g
        elif kind == "run":
            assert last_group is not None and g[0] in last_group, (g, last_group)
    for i, where, text_encoder in seen:
        group = i // blocks_per_group
        on_device = {j for j, d in enumerate(where) if d == ours.device.type}
        assert i in on_device and text_encoder == "cpu"
        if ours.device.type != "cpu":  # only this group (and the prefetched next) is resident
            assert on_device <= {j for j in range(len(blocks)) if j // blocks_per_group in (group, group + 1)}


def test_unknown_mode_is_refused(path):
    with pytest.raises(ValueError, match="offload: 'disk' is not one of model|layerwise"):
        load("z-image", path, offload="disk")
