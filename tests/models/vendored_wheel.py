"""Authors' packages as parity references, imported privately inside the tests.

Some authors' packages pin old versions or pull in dependencies their model code never runs,
so they are not installed: the wheel is fetched with `pip download --no-deps` (once, into the
zoo cache folder), the modules a test needs are copied into a private package, and the edits
a test needs are applied as literal replacements that must match (a changed wheel fails
here, not silently). Nothing in torch, transformers or omnistage is patched.
"""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest


def fetch_wheel(cache: Path, requirement: str) -> Path:
    """The wheel of `requirement` ("name==version") from the cache, downloaded the first time;
    the test is skipped when it cannot be downloaded."""
    name, version = requirement.split("==")
    folder = cache / f"{name}-wheel"
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        run = subprocess.run([sys.executable, "-m", "pip", "download", requirement, "--no-deps", "-d", str(folder)],
                             capture_output=True, text=True, timeout=300)
        found = sorted(folder.glob(pattern))
        if run.returncode != 0 or not found:
            pytest.skip(f"the reference package {requirement} could not be downloaded: {run.stderr[-300:]}")
    return found[0]


def vendor(cache: Path, requirement: str, package: str, pick: Callable[[str], str | None],
           adaptations: Iterable[tuple[str, str, str, str]], empty: Iterable[str] = ("__init__.py",),
           appends: Mapping[str, str] | None = None):
    """The wheel's files that `pick` maps to a path (wheel name -> path in the package, or None to
    leave it out), with each (file, old, new, why) of `adaptations` applied, the `appends` texts
    added at the ends of their files and the `empty` files written empty, importable as `package`."""
    if package in sys.modules:
        return sys.modules[package]
    adaptations, appends = list(adaptations), dict(appends or {})
    digest = hashlib.sha256(repr((requirement, adaptations, appends)).encode()).hexdigest()[:12]
    root = cache / f"{package.strip('_')}-{digest}"  # rebuilt when the adaptations change
    target = root / package
    if not (target / ".complete").exists():
        with zipfile.ZipFile(fetch_wheel(cache, requirement)) as wheel:
            sources = {path: wheel.read(name).decode() for name in wheel.namelist()
                       if (path := pick(name)) is not None}
        for name, old, new, why in adaptations:
            if old not in sources[name]:
                raise AssertionError(f"adaptation for {name} ({why}) no longer matches the wheel")
            sources[name] = sources[name].replace(old, new)
        for name, text in appends.items():
            sources[name] += text
        sources |= {name: "" for name in empty}
        for name, text in sources.items():
            path = target / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (target / ".complete").write_text("")
    sys.path.insert(0, str(root))
    return importlib.import_module(package)
