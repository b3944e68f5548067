"""Shared fixtures: the zoo is built once per machine into a cache dir in the repo.

The whole run uses one intra-op thread (`pytest_configure`): tiny models are bound by per-op
overhead, and on a shared 2-core machine a second OpenMP thread made a tiny model's step 10-15x
slower (its spinning fights every other process for the cores)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ZOO_CACHE = Path(__file__).resolve().parent.parent / ".omnistage-cache" / "zoo"

# Every model is a local zoo folder: a path the Hub is asked about anyway (a made-up model_path,
# a missing folder) must fail at once, not after huggingface_hub's ~25 s of retries offline.
# Set at import, before any test module imports huggingface_hub (it reads this once).
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config):
    # OMP_NUM_THREADS reaches every process the tests start (servers, ranks, Ray nodes) through
    # the environment; this process may have imported torch already, so it is told directly too.
    # A value set by whoever runs the suite wins.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def zoo():
    """`zoo(name, size="tiny")` -> path of the built zoo checkpoint (built once, cached on disk)."""
    from omnistage.testing import ensure

    def get(name: str, size: str = "tiny") -> Path:
        return ensure(name, size=size, cache_dir=ZOO_CACHE)

    return get


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for the module, restored after it, whatever OMP_NUM_THREADS the
    run was given. Tiny models are bound by per-op overhead: extra threads cost more in start-up
    and OpenMP spinning than they save in math (the Wan parity file ran 5x longer with 2 threads
    on a shared 2-core machine). Folders of tiny-model tests turn it on for every module in their
    conftest.py."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
