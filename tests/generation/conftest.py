"""Fixtures for the generation engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny decoders are bound by per-op overhead; one intra-op thread avoids OpenMP spinning on a
    shared machine. Restored after each module."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def csm_path(zoo) -> str:
    return str(zoo("csm", size="tiny"))
