"""`import_target` and `ComponentRegistry`: the classes stage engines run, found by key.

Each engine kind has one registry: AR models (ar/model.py), decoders (generation/decoder.py)
and native diffusion pipelines (diffusion/registry.py). A family registers its classes
under the key its `StageSpec.model` names, from its torch-free package `__init__.py`, as a
"module:Class" path so registering imports nothing heavy:

    register_ar_model("qwen2_5_omni.talker", "omnistage.models.qwen2_5_omni.talker:OmniTalker")

An engine asks for a key; a key not registered yet makes the registry load every family and
plugin once (through the `discover` it was given: the pipeline registry's discovery), so
engines find families by key and never import `omnistage.models` themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def import_target(target: str | type) -> Any:
    """A "module:Class" path (or an already imported class) -> the class."""
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":")
    if not name:
        raise ValueError(f"expected 'module:Class', got {target!r}")
    return getattr(importlib.import_module(module), name)


class ComponentRegistry:
    def __init__(self, kind: str, discover: Callable[[], None], builtins: dict[str, str | type] | None = None):
        self.kind = kind
        """What the registry holds, for messages ("AR model", "decoder", "diffusion pipeline")."""
        self._discover = discover
        """Imports the families and plugins, which register on import (a no-op once done)."""
        self._targets: dict[str, str | type] = dict(builtins or {})

    def register(self, key: str, target: str | type) -> None:
        if key in self._targets and self._targets[key] != target:
            raise ValueError(f"{self.kind} key {key!r} is already registered to {self._targets[key]!r}")
        self._targets[key] = target

    def __contains__(self, key: str) -> bool:
        return self.find(key) is not None

    def find(self, key: str) -> str | type | None:
        """The registered target (not imported), loading the families first if needed; None if unknown."""
        if key not in self._targets:
            self._discover()
        return self._targets.get(key)

    def get(self, key: str) -> type:
        """The class registered under `key`; a ValueError listing the keys when there is none."""
        target = self.find(key)
        if target is None:
            raise ValueError(f"no {self.kind} registered for StageSpec.model={key!r}; registered: {self.keys()}")
        return import_target(target)

    def keys(self) -> list[str]:
        return sorted(self._targets)
