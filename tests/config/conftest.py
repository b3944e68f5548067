"""Fixtures for config tests: fake model folders, YAML files, and a registry sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from omnistage.config.registry import REGISTRY


@pytest.fixture
def registry():
    """The process registry with families loaded; registrations made in the test are undone."""
    REGISTRY.discover()
    saved = dict(REGISTRY._entries)
    yield REGISTRY
    REGISTRY._entries.clear()
    REGISTRY._entries.update(saved)


@pytest.fixture
def make_model(tmp_path):
    """`make_model(name, config=..., model_index=...)` -> a folder holding just those JSON files."""

    def make(name: str = "model", config: dict | None = None, model_index: dict | None = None) -> Path:
        path = tmp_path / name
        path.mkdir()
        if config is not None:
            (path / "config.json").write_text(json.dumps(config))
        if model_index is not None:
            (path / "model_index.json").write_text(json.dumps(model_index))
        return path

    return make


@pytest.fixture
def write_yaml(tmp_path):
    """`write_yaml("a.yaml", {...} or "text")` -> path of the written file under tmp_path."""

    def write(name: str, content) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
        return path

    return write
