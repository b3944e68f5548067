"""The parity reference for MOSS-TTS: the authors' `moss-tts-lite` 1.1.0 (their eager
`generate`, the reference path of their CLI, and their codec decoder).

The wheel is fetched with `pip download --no-deps` (once, into the zoo cache folder) and the
modules the eager path needs are copied into a private package with the edits in
`ADAPTATIONS`, each a literal replacement that must match (a changed wheel fails here, not
silently). Its CUDA-graph and quantised paths (fast*, gptq, export) are left out. Nothing in
torch or omnistage is patched.
"""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

WHEEL = "moss-tts-lite==1.1.0"
PACKAGE = "_moss_tts_reference"
MODULES = ("model", "generate", "sampling", "prompt", "bpe", "normalizer", "codec", "st_loader")

RELEASED_STAGES = '''_DECODER_TRANSFORMERS = [

    (768, 1280, 1280, 32, 20),
    (640, 768, 768, 12, 12),
    (384, 768, 768, 12, 12),
    (384, 240, 768, 12, 12),
]'''

# (file, old, new, why)
ADAPTATIONS = (
    ("prompt.py", "from moss_tts_lite.", "from .", "the package is imported under a private name"),
    ("codec.py", "from moss_tts_lite.st_loader import", "from .st_loader import",
     "the package is imported under a private name"),
    ("codec.py", RELEASED_STAGES, None, "the decoder's stage sizes are constants of the released model: the "
                                       "zoo's (tests build them from omnistage.testing.moss_tts_models)"),
)


def _wheel(cache: Path) -> Path:
    folder = cache / "moss-tts-lite-wheel"
    found = sorted(folder.glob("moss_tts_lite-1.1.0-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        run = subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-d", str(folder)],
                             capture_output=True, text=True, timeout=300)
        found = sorted(folder.glob("moss_tts_lite-1.1.0-*.whl"))
        if run.returncode != 0 or not found:
            pytest.skip(f"the reference package {WHEEL} could not be downloaded: {run.stderr[-300:]}")
    return found[0]


def _tiny_stages() -> str:
    from omnistage.testing.moss_tts_models import CODEC_STAGES

    return "_DECODER_TRANSFORMERS = [\n" + "".join(f"    {s},\n" for s in CODEC_STAGES) + "]"


def load_reference(cache: Path):
    """The adapted `moss_tts_lite` modules, importable as `_moss_tts_reference.<module>`."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    adaptations = [(f, old, new if new is not None else _tiny_stages(), why) for f, old, new, why in ADAPTATIONS]
    digest = hashlib.sha256(repr(adaptations).encode()).hexdigest()[:12]
    root = cache / f"moss-tts-reference-{digest}"  # rebuilt when the adaptations change
    package = root / PACKAGE
    if not (package / ".complete").exists():
        with zipfile.ZipFile(_wheel(cache)) as wheel:
            sources = {f"{m}.py": wheel.read(f"moss_tts_lite/{m}.py").decode() for m in MODULES}
        for name, old, new, why in adaptations:
            if old not in sources[name]:
                raise AssertionError(f"adaptation for {name} ({why}) no longer matches the wheel")
            sources[name] = sources[name].replace(old, new)
        sources["__init__.py"] = ""
        package.mkdir(parents=True, exist_ok=True)
        for name, text in sources.items():
            (package / name).write_text(text)
        (package / ".complete").write_text("")
    sys.path.insert(0, str(root))
    return importlib.import_module(PACKAGE)


def module(cache: Path, name: str):
    load_reference(cache)
    return importlib.import_module(f"{PACKAGE}.{name}")
