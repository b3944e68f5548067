import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every module here runs its tiny models on one intra-op thread (tests/conftest.py)."""
