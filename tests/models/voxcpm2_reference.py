"""The parity reference for VoxCPM2: the authors' `voxcpm` 2.0.3 model modules.

`voxcpm` requires torchaudio, torchcodec, gradio, funasr and more, none of which the model
itself runs, so it is not installed: its wheel is fetched with `pip download --no-deps`
(once, into the zoo cache folder), and `voxcpm/model/` and `voxcpm/modules/` are copied into
a private package with the edits in `ADAPTATIONS`, each a literal replacement that must match
(a changed wheel fails here, not silently). The package's own `__init__` files (which import
the CLI's, the denoiser's and VoxCPM1's dependencies) are replaced by empty ones. Nothing in
transformers or omnistage is patched.

`VoxCPM2Model.from_local` loads its weights with `strict=False`; `reference_model` checks that
every tensor of the checkpoint was taken (and none of the model's left out), so a format
mismatch fails instead of leaving random weights behind.
"""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

WHEEL = "voxcpm==2.0.3"
PACKAGE = "_voxcpm_reference"

# soundfile stands in for librosa.load: the tests write the clips at the VAE's 16 kHz.
LOAD_WAV = '''        import soundfile

        audio, rate = soundfile.read(wav_path, dtype="float32")
        assert rate == self._encode_sample_rate, (rate, self._encode_sample_rate)
'''

# (file, old, new, why)
ADAPTATIONS = (
    ("model/voxcpm2.py", "import librosa\n", "librosa = None\n",
     "librosa is not installed: it only trims silence (off by default) and loads files"),
    ("model/voxcpm2.py", "        audio, _ = librosa.load(wav_path, sr=self._encode_sample_rate, mono=True)\n",
     LOAD_WAV, "loading a clip already at the VAE's rate, without librosa"),
)


def _wheel(cache: Path) -> Path:
    folder = cache / "voxcpm-wheel"
    found = sorted(folder.glob("voxcpm-2.0.3-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        run = subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-d", str(folder)],
                             capture_output=True, text=True, timeout=300)
        found = sorted(folder.glob("voxcpm-2.0.3-*.whl"))
        if run.returncode != 0 or not found:
            pytest.skip(f"the reference package {WHEEL} could not be downloaded: {run.stderr[-300:]}")
    return found[0]


def load_reference(cache: Path):
    """The vendored `voxcpm` model package (adapted), importable as `_voxcpm_reference`."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    digest = hashlib.sha256(repr(ADAPTATIONS).encode()).hexdigest()[:12]
    root = cache / f"voxcpm-reference-{digest}"  # rebuilt when the adaptations change
    package = root / PACKAGE
    if not (package / ".complete").exists():
        with zipfile.ZipFile(_wheel(cache)) as wheel:
            sources = {name[len("voxcpm/"):]: wheel.read(name).decode() for name in wheel.namelist()
                       if name.startswith(("voxcpm/model/", "voxcpm/modules/")) and name.endswith(".py")}
        for name, old, new, why in ADAPTATIONS:
            if old not in sources[name]:
                raise AssertionError(f"adaptation for {name} ({why}) no longer matches the wheel")
            sources[name] = sources[name].replace(old, new)
        sources["__init__.py"] = sources["model/__init__.py"] = ""
        for name, text in sources.items():
            path = package / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (package / ".complete").write_text("")
    sys.path.insert(0, str(root))
    return importlib.import_module(PACKAGE)


def reference_model(cache: Path, model_path: str):
    """The authors' `VoxCPM2Model` over the zoo checkpoint (fp32, CPU, no torch.compile), every
    checkpoint tensor loaded."""
    from safetensors.torch import load_file

    load_reference(cache)
    voxcpm2 = importlib.import_module(f"{PACKAGE}.model.voxcpm2")
    model = voxcpm2.VoxCPM2Model.from_local(model_path, optimize=False, device="cpu")
    expected = set(load_file(f"{model_path}/model.safetensors")) | {
        f"audio_vae.{k}" for k in load_file(f"{model_path}/audiovae.safetensors")}
    assert set(model.state_dict()) == expected, sorted(set(model.state_dict()) ^ expected)[:10]
    return model
