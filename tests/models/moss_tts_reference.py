"""The parity reference for MOSS-TTS: the authors' `moss-tts-lite` 1.1.0 (their eager
`generate`, the reference path of their CLI, and their codec decoder).

The modules the eager path needs are copied from the wheel into a private package with the
edits in `ADAPTATIONS` (vendored_wheel.py). Its CUDA-graph and quantised paths (fast*, gptq,
export) are left out.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from vendored_wheel import vendor

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


def _tiny_stages() -> str:
    from omnistage.testing.moss_tts_models import CODEC_STAGES

    return "_DECODER_TRANSFORMERS = [\n" + "".join(f"    {s},\n" for s in CODEC_STAGES) + "]"


def _pick(name: str) -> str | None:
    module_name = name.removeprefix("moss_tts_lite/").removesuffix(".py")
    return f"{module_name}.py" if name.startswith("moss_tts_lite/") and module_name in MODULES else None


def load_reference(cache: Path):
    """The adapted `moss_tts_lite` modules, importable as `_moss_tts_reference.<module>`."""
    adaptations = [(f, old, new if new is not None else _tiny_stages(), why) for f, old, new, why in ADAPTATIONS]
    return vendor(cache, WHEEL, PACKAGE, _pick, adaptations)


def module(cache: Path, name: str):
    load_reference(cache)
    return importlib.import_module(f"{PACKAGE}.{name}")
