"""The parity reference for Fish Speech's dual-AR transformer: the authors' `fish-speech` 0.1.0
(its `DualARTransformer`, `ContentSequence` prompt and eager `generate`).

The wheel requires lightning, gradio, wandb, descript-audio-codec and more, none of which the
transformer runs, so it is not installed: the four modules it needs are copied from the wheel
into a private package with the edits in `ADAPTATIONS` (vendored_wheel.py). The codec's
decoder (`models/dac/modded_dac.py`, `rvq.py`) builds on descript-audio-codec 1.0.0's
`dac/nn/{layers,quantize}.py` (torch, einops, numpy), vendored the same way; its audiotools,
hydra, librosa and omegaconf imports serve training and file I/O only.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from vendored_wheel import vendor

WHEEL = "fish-speech==0.1.0"
PACKAGE = "_fish_speech_reference"
FILES = {"fish_speech/tokenizer.py": "tokenizer.py", "fish_speech/content_sequence.py": "content_sequence.py",
         "fish_speech/models/text2semantic/llama.py": "llama.py",
         "fish_speech/models/text2semantic/inference.py": "inference.py",
         "fish_speech/models/dac/modded_dac.py": "modded_dac.py", "fish_speech/models/dac/rvq.py": "rvq.py"}
DAC_WHEEL = "descript-audio-codec==1.0.0"
DAC_PACKAGE = "_dac_reference"
DAC_FILES = {"dac/nn/layers.py": "layers.py", "dac/nn/quantize.py": "quantize.py"}
LOGGER = "import logging\n\nlogger = logging.getLogger(__name__)\n"
PRIVATE = "the package is imported under a private name"

# (file, old, new, why)
ADAPTATIONS = (
    ("llama.py", "from loguru import logger\n", LOGGER, "loguru is not installed; the stdlib logger stands in"),
    ("llama.py", "from fish_speech.models.text2semantic.lora import LoraConfig, setup_lora\n",
     "LoraConfig = setup_lora = object\n", "LoRA is training-only (loralib is not installed)"),
    ("llama.py", "from fish_speech.tokenizer import", "from .tokenizer import", PRIVATE),
    ("content_sequence.py", "from fish_speech.tokenizer import", "from .tokenizer import", PRIVATE),
    ("inference.py", "from loguru import logger\n", LOGGER, "loguru is not installed; the stdlib logger stands in"),
    ("inference.py", "from fish_speech.content_sequence import", "from .content_sequence import", PRIVATE),
    ("inference.py", "from fish_speech.tokenizer import", "from .tokenizer import", PRIVATE),
    ("inference.py", "from fish_speech.models.text2semantic.llama import", "from .llama import", PRIVATE),
    ("inference.py", "torch._inductor.config.coordinate_descent_tuning = True\n"
                     "torch._inductor.config.triton.unique_kernel_names = True\n", "",
     "torch.compile settings the eager reference never reads, kept out of the test process"),
    ("modded_dac.py", "import hydra\nimport librosa\n", "", "training-only imports, not installed"),
    ("modded_dac.py", "import soundfile as sf\n", "", "file I/O only, not used by the decoder"),
    ("modded_dac.py", "from audiotools import AudioSignal\nfrom audiotools.ml import BaseModel\n"
                      "from dac.model.base import CodecMixin\nfrom dac.nn.layers import",
     "from _dac_reference.layers import", "audiotools (training and file I/O) is not installed; the decode "
     "test composes the quantizer and decoder as `DAC.decode` does, without the `DAC` wrapper"),
    ("modded_dac.py", "from omegaconf import OmegaConf\n", "", "config loading only, not installed"),
    ("modded_dac.py", "class DAC(BaseModel, CodecMixin):", "class DAC(nn.Module):",
     "audiotools' BaseModel and DAC's CodecMixin (file I/O, chunked encoding) are not vendored"),
    ("rvq.py", "from dac.nn.quantize import", "from _dac_reference.quantize import", PRIVATE),
)
DAC_ADAPTATIONS = (("quantize.py", "from dac.nn.layers import", "from .layers import", PRIVATE),)


def module(cache: Path, name: str):
    vendor(cache, DAC_WHEEL, DAC_PACKAGE, DAC_FILES.get, DAC_ADAPTATIONS)
    vendor(cache, WHEEL, PACKAGE, FILES.get, ADAPTATIONS)
    return importlib.import_module(f"{PACKAGE}.{name}")


def authors_prompt(cache: Path, model, text: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(prompt rows, audio masks, audio parts) of a plain text request, as the authors' `generate` takes them."""
    content = module(cache, "content_sequence")
    seq = content.ContentSequence(modality="interleave")
    seq.append([content.TextPart(text=text)], add_end=False, speaker=0)
    return seq.encode_for_inference(model.tokenizer, model.config.num_codebooks)


def authors_codec(cache: Path, path: str):
    """The authors' decoder modules at the tiny codec's sizes, codec.pth loaded as they load it
    (strict=False): `DAC.decode` is `decoder(quantizer.decode(codes))`. Returns the modules (a
    ModuleDict of "quantizer" and "decoder") and `load_state_dict`'s missing and unexpected keys."""
    from omnistage.testing.fish_speech_models import CODEC

    dac, rvq = module(cache, "modded_dac"), module(cache, "rvq")
    dim = CODEC["latent_dim"]
    config = dac.ModelArgs(block_size=4096, n_layer=CODEC["n_layer"], n_head=dim // 64, dim=dim, head_dim=64,
                           intermediate_size=CODEC["intermediate_size"])
    window = dac.WindowLimitedTransformer(config, input_dim=dim, window_size=128, causal=True)
    quantizer = rvq.DownsampleResidualVectorQuantize(
        input_dim=dim, n_codebooks=3, codebook_size=1024, codebook_dim=CODEC["codebook_dim"],
        semantic_codebook_size=1024, downsample_factor=CODEC["downsample_factor"], post_module=window)
    decoder = dac.Decoder(dim, CODEC["decoder_dim"], list(CODEC["decoder_rates"]), causal=True)
    both = torch.nn.ModuleDict({"quantizer": quantizer, "decoder": decoder}).eval()
    loaded = both.load_state_dict(torch.load(f"{path}/codec.pth", weights_only=True), strict=False)
    return both, loaded
