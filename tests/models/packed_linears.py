"""Shared by the families' prepacked-linear tests: pack every linear layer of a zoo model (its
layers are all below core/cpu_linear.py's size threshold, where packing pays) and check
that every stage of a running pipeline did."""

from __future__ import annotations

import torch


def pack_every_linear(monkeypatch) -> None:
    from omnistage.core import cpu_linear

    monkeypatch.setattr(cpu_linear, "MIN_PACKED_WEIGHT", dict.fromkeys(cpu_linear.MIN_PACKED_WEIGHT, 1))


def assert_every_stage_packed(omni) -> None:
    """No plain `nn.Linear` is left in any stage's torch module (AR models and decoders)."""
    for stage_id, handle in omni.async_omni.orchestrator.handles.items():
        engine = handle.endpoint.server.engine  # the supervisor's inline endpoint
        module = engine.model.model if hasattr(engine, "model") else engine.decoder.model
        assert not any(type(m) is torch.nn.Linear for m in module.modules()), f"stage {stage_id}"
