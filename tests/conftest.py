"""Shared fixtures: the zoo is built once per machine into a cache dir in the repo."""

from __future__ import annotations

from pathlib import Path

import pytest

ZOO_CACHE = Path(__file__).resolve().parent.parent / ".omnistage-cache" / "zoo"


@pytest.fixture(scope="session")
def zoo():
    """`zoo(name, size="tiny")` -> path of the built zoo checkpoint (built once, cached on disk)."""
    from omnistage.testing import ensure

    def get(name: str, size: str = "tiny") -> Path:
        return ensure(name, size=size, cache_dir=ZOO_CACHE)

    return get
