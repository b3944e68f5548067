"""The parity reference for VoxCPM2: the authors' `voxcpm` 2.0.3 model modules.

`voxcpm` requires torchaudio, torchcodec, gradio, funasr and more, none of which the model
itself runs, so it is not installed: `voxcpm/model/` and `voxcpm/modules/` are copied from its
wheel into a private package with the edits in `ADAPTATIONS` (vendored_wheel.py). The package's own `__init__` files (which import
the CLI's, the denoiser's and VoxCPM1's dependencies) are replaced by empty ones. Nothing in
transformers or omnistage is patched.

`VoxCPM2Model.from_local` loads its weights with `strict=False`; `reference_model` checks that
every tensor of the checkpoint was taken (and none of the model's left out), so a format
mismatch fails instead of leaving random weights behind.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from vendored_wheel import vendor

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


def _pick(name: str) -> str | None:
    if name.startswith(("voxcpm/model/", "voxcpm/modules/")) and name.endswith(".py"):
        return name[len("voxcpm/"):]
    return None


def load_reference(cache: Path):
    """The vendored `voxcpm` model package (adapted), importable as `_voxcpm_reference`."""
    return vendor(cache, WHEEL, PACKAGE, _pick, ADAPTATIONS, empty=("__init__.py", "model/__init__.py"))


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
