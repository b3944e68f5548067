"""Lazy package exports: a package names what it exports and where, and the first use of a
name imports its module, so `import omnistage` (or `omnistage.ar`) pulls in no torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__` that imports `exports[name]` on first use and caches the value."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value  # later lookups skip this hook
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
