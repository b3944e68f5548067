"""Fixtures for the generation engine tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every module here runs its tiny models on one intra-op thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def csm_path(zoo) -> str:
    return str(zoo("csm", size="tiny"))
