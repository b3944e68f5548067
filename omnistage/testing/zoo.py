"""The tiny model zoo: random-weight checkpoints written in the real on-disk formats.

Each entry knows how to write one model family at a given size. Builders live in
`diffusion_models.py` (diffusers `model_index.json` folders), `speech_models.py` and
`omni_models.py` (transformers folders); they register themselves here with `register_zoo_model`.

`build(name, out_dir)` writes a checkpoint; `ensure(name)` builds it once into a cache
directory and returns the path, which is what tests and the demo server use.
`call_kwargs(name, size)` is the one place tests and benchmarks get the kwargs that call a
diffusion family's reference pipeline (each builder registers them with its model).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# Bump when any builder changes its output, so cached folders are rebuilt (or bump one
# model's `revision`, which rebuilds only that model).
ZOO_VERSION = 1
SIZES = ("tiny", "small")


@dataclass(frozen=True)
class ZooModel:
    name: str
    kind: str  # "diffusion" | "ar" | "omni" | "speech"
    reference_class: str  # the reference library class that loads it, e.g. "diffusers.ZImagePipeline"
    builder: Callable[[Path, str, int], None]  # (out_dir, size, seed) -> writes the checkpoint
    sizes: tuple[str, ...] = ("tiny",)
    description: str = ""
    extras: dict = field(default_factory=dict)
    revision: int = 0  # bumped when this builder's output changes; in the cache folder name from 1 on
    # The reference pipeline's call on `tiny` (diffusion families; read it through `call_kwargs`).
    # Families that edit or animate an image also need `image=` (diffusion_models.default_input_image).
    call_kwargs: dict = field(default_factory=dict)
    sides: dict[str, int] = field(default_factory=dict)  # output height = width per size, where the call sets them


_ZOO: dict[str, ZooModel] = {}


def register_zoo_model(model: ZooModel) -> ZooModel:
    _ZOO[model.name] = model
    return model


def _load_builders() -> None:
    # Imported lazily: builders import torch/diffusers/transformers.
    from omnistage.testing import diffusion_models, omni_models, speech_models  # noqa: F401
    from omnistage.testing import flux2_models  # noqa: F401
    from omnistage.testing import hunyuan_video_models  # noqa: F401
    from omnistage.testing import ltx2_models  # noqa: F401
    from omnistage.testing import qwen_image21_models, qwen_image_edit_plus_models  # noqa: F401
    from omnistage.testing import stable_audio_models  # noqa: F401
    from omnistage.testing import qwen3_tts_models  # noqa: F401
    from omnistage.testing import glm_image_models  # noqa: F401
    from omnistage.testing import sdxl_models  # noqa: F401
    from omnistage.testing import flux_kontext_models  # noqa: F401
    from omnistage.testing import ernie_image_models  # noqa: F401
    from omnistage.testing import ovis_image_models  # noqa: F401
    from omnistage.testing import krea2_models  # noqa: F401
    from omnistage.testing import longcat_image_models  # noqa: F401
    from omnistage.testing import qwen_image_layered_models  # noqa: F401
    from omnistage.testing import hidream_image_models  # noqa: F401
    from omnistage.testing import sana_video_models  # noqa: F401
    from omnistage.testing import wan_vace_models  # noqa: F401
    from omnistage.testing import joyimage_models  # noqa: F401
    from omnistage.testing import higgs_audio_models  # noqa: F401
    from omnistage.testing import qwen3_asr_models  # noqa: F401
    from omnistage.testing import helios_models  # noqa: F401
    from omnistage.testing import kandinsky6_models  # noqa: F401
    from omnistage.testing import voxcpm2_models  # noqa: F401
    from omnistage.testing import cosmos3_models  # noqa: F401
    from omnistage.testing import sana_wm_models  # noqa: F401
    from omnistage.testing import moss_tts_models  # noqa: F401
    from omnistage.testing import fish_speech_models  # noqa: F401
    from omnistage.testing import moshi_models  # noqa: F401
    from omnistage.testing import omnivoice_models  # noqa: F401


def list_models() -> list[ZooModel]:
    _load_builders()
    return [_ZOO[k] for k in sorted(_ZOO)]


def get_model(name: str) -> ZooModel:
    _load_builders()
    if name not in _ZOO:
        raise KeyError(f"unknown zoo model {name!r}; available: {', '.join(sorted(_ZOO))}")
    return _ZOO[name]


def call_kwargs(name: str, size: str = "tiny") -> dict:
    """A fresh copy of the kwargs that call zoo model `name`'s reference pipeline at `size`: the
    registered `tiny` call with height and width set to the family's side at `size`."""
    model = get_model(name)
    if not model.call_kwargs:
        raise KeyError(f"zoo model {name!r} registers no call kwargs")
    if size not in model.sizes:
        raise ValueError(f"zoo model {name!r} has sizes {list(model.sizes)}, not {size!r}")
    kwargs = copy.deepcopy(model.call_kwargs)
    if "height" in kwargs:
        kwargs["height"] = kwargs["width"] = model.sides[size]
    return kwargs


def build(name: str, out_dir: str | os.PathLike, size: str = "tiny", seed: int = 0) -> Path:
    """Write the zoo model `name` at `size` into `out_dir` (created; must be empty or absent)."""
    model = get_model(name)
    if size not in model.sizes:
        raise ValueError(f"zoo model {name!r} has sizes {list(model.sizes)}, not {size!r}")
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    model.builder(out, size, seed)
    return out


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "omnistage" / "zoo"


def ensure(name: str, size: str = "tiny", seed: int = 0, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the cached checkpoint for (name, size, seed), building it first if needed.

    The build goes to a temporary folder that is renamed into place, so a crash or a
    concurrent build never leaves a half-written model behind; a lock file per target makes
    concurrent callers (parallel test workers) wait for one build instead of each running it.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    revision = get_model(name).revision
    target = root / f"{name}-{size}-s{seed}-v{ZOO_VERSION}{f'r{revision}' if revision else ''}"
    if (target / ".complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f".{target.name}.lock"):
        if (target / ".complete").exists():  # built by whoever held the lock before us
            return target
        _build_into(name, size, seed, root, target)
    return target


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (POSIX flock; released if the holder dies). Without
    fcntl the build is unlocked: still safe (the rename), only possibly done twice."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build_into(name: str, size: str, seed: int, root: Path, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        build(name, tmp / "m", size=size, seed=seed)
        (tmp / "m" / ".complete").write_text(json.dumps({"name": name, "size": size, "seed": seed}))
        try:
            os.rename(tmp / "m", target)
        except OSError:
            if not (target / ".complete").exists():  # lost a race to a half-built target: replace it
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp / "m", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
