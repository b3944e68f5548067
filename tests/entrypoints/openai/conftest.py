"""Fixtures for the route tests: apps around the fake engine of fake_engine.py."""

from __future__ import annotations

import pytest
from fake_engine import make_client


@pytest.fixture
def app_client():
    """`app_client(kind, **settings)` -> (TestClient, FakeEngine); the apps are closed after the test."""
    opened = []

    def make(kind: str, **settings):
        client, engine = make_client(kind, **settings)
        client.__enter__()  # runs the lifespan
        opened.append(client)
        return client, engine

    yield make
    for client in opened:
        client.__exit__(None, None, None)
