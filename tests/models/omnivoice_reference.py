"""The parity reference for OmniVoice: the authors' `omnivoice` 0.2.1 (`OmniVoice` and its
generation internals, as `generate` calls them).

Its model module and the utils it imports are copied from the wheel into a private package
with the edits in `ADAPTATIONS` (vendored_wheel.py): torchaudio and pydub are no
dependencies of ours and the paths the tests take do not use them (resampling and silence
removal of a reference clip; the tests give the clip's codes). The model loads as in the
authors' `from_pretrained` with `train=True`, then gets the tokenizers their non-train branch
would load; the audio tokenizer is transformers' class imported as higgs_audio_reference does.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from vendored_wheel import vendor

WHEEL = "omnivoice==0.2.1"
PACKAGE = "_omnivoice_reference"
FILES = ("models/omnivoice.py", "utils/audio.py", "utils/duration.py", "utils/lang_map.py", "utils/text.py",
         "utils/voice_design.py")
UNUSED = "not used on the tests' paths (a reference clip's resampling and silence removal)"

# (file, old, new, why)
ADAPTATIONS = (
    ("models/omnivoice.py", "import torchaudio\n", "", UNUSED),
    ("models/omnivoice.py", "from omnivoice.", f"from {PACKAGE}.", "the package is imported under a private name"),
    ("utils/audio.py", "import torchaudio\n", "", UNUSED),
    ("utils/audio.py", "from pydub import AudioSegment\nfrom pydub.silence import detect_leading_silence, "
     "detect_nonsilent, split_on_silence\n", "AudioSegment = None\n", UNUSED),
)


def _pick(name: str) -> str | None:
    path = name.removeprefix("omnivoice/")
    return path if name.startswith("omnivoice/") and path in FILES else None


def reference_model(cache: Path, path: str):
    """The authors' `OmniVoice` on the checkpoint folder `path`, ready to generate."""
    import torch
    from transformers import AutoFeatureExtractor, AutoTokenizer

    from higgs_audio_reference import _audio_tokenizer_class

    vendor(cache, WHEEL, PACKAGE, _pick, ADAPTATIONS,
           empty=("__init__.py", "models/__init__.py", "utils/__init__.py"))
    module = importlib.import_module(f"{PACKAGE}.models.omnivoice")
    model = module.OmniVoice.from_pretrained(path, train=True, dtype=torch.float32).eval()
    model.text_tokenizer = AutoTokenizer.from_pretrained(path)
    model.audio_tokenizer = _audio_tokenizer_class().from_pretrained(Path(path) / "audio_tokenizer").eval()
    model.feature_extractor = AutoFeatureExtractor.from_pretrained(Path(path) / "audio_tokenizer")
    model.sampling_rate = model.feature_extractor.sampling_rate
    model.duration_estimator = importlib.import_module(f"{PACKAGE}.utils.duration").RuleDurationEstimator()
    return module, model
