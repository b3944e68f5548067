"""The parity reference for Qwen3-TTS: the authors' `qwen-tts` 0.1.1 modules, adapted to transformers 5.

`qwen-tts` pins transformers 4.57.3, so it is not installed: the modules the CustomVoice /
VoiceDesign paths run are copied from its wheel into a private package with the edits in
`ADAPTATIONS` (vendored_wheel.py); the package's own `__init__` files (which import the 25 Hz
tokenizer and librosa) are replaced by empty ones.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from vendored_wheel import vendor

WHEEL = "qwen-tts==0.1.1"
PACKAGE = "_qwen_tts_reference"
FILES = (
    "core/models/configuration_qwen3_tts.py",
    "core/models/modeling_qwen3_tts.py",
    "core/models/processing_qwen3_tts.py",
    "core/tokenizer_12hz/configuration_qwen3_tts_tokenizer_v2.py",
    "core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py",
    "inference/qwen3_tts_model.py",
    "inference/qwen3_tts_tokenizer.py",
)

# transformers 4's generate passed `past_key_values` and `cache_position`; 5 passes `cache` only.
CACHE_POSITION = '''        past_key_values = cache
        if cache_position is None:
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            length = (inputs_embeds if inputs_embeds is not None and inputs_embeds.shape[1] > 1 else input_ids).shape[1]
            device = (inputs_embeds if input_ids is None else input_ids).device
            cache_position = torch.arange(past, past + length, device=device)
'''

# librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax) (slaney scale and norm, its defaults) from transformers.
LIBROSA_MEL = '''def librosa_mel_fn(sr, n_fft, n_mels, fmin, fmax):
    from transformers.audio_utils import mel_filter_bank

    return mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=n_mels, min_frequency=fmin,
                           max_frequency=fmax if fmax is not None else sr / 2, sampling_rate=sr, norm="slaney",
                           mel_scale="slaney").T
'''

# (file, old, new, why): what transformers 5.24 (or the absent librosa) breaks.
ADAPTATIONS = (
    ("core/models/modeling_qwen3_tts.py", "from librosa.filters import mel as librosa_mel_fn\n", LIBROSA_MEL,
     "librosa is not installed: its slaney mel filters come from transformers' mel_filter_bank instead"),
    ("inference/qwen3_tts_model.py", "import librosa\n", "librosa = None\n", "librosa: resampling for cloning only"),
    ("inference/qwen3_tts_tokenizer.py", "import librosa\n", "librosa = None\n", "librosa: loading files only"),
    ("inference/qwen3_tts_tokenizer.py",
     "from ..core import (\n    Qwen3TTSTokenizerV1Config,\n    Qwen3TTSTokenizerV1Model,\n    Qwen3TTSTokenizerV2Config,\n"
     "    Qwen3TTSTokenizerV2Model,\n)",
     "from ..core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config\n"
     "from ..core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model\n"
     "Qwen3TTSTokenizerV1Config = Qwen3TTSTokenizerV1Model = None",
     "the 25 Hz tokenizer is not vendored (the 12 Hz checkpoints do not use it)"),
    ("inference/qwen3_tts_model.py", "from ..core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, "
     "Qwen3TTSProcessor",
     "from ..core.models.configuration_qwen3_tts import Qwen3TTSConfig\n"
     "from ..core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration\n"
     "from ..core.models.processing_qwen3_tts import Qwen3TTSProcessor",
     "the package __init__ is not vendored"),
    ("core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py", "    @check_model_inputs()\n",
     "    @check_model_inputs\n", "transformers 5: the decorator takes the function, not arguments"),
    ("core/models/modeling_qwen3_tts.py", "self.padding_idx = config.pad_token_id",
     "self.padding_idx = getattr(config, 'pad_token_id', None)",
     "transformers 5 configs no longer declare pad_token_id (the value is unused)"),
    ("core/models/modeling_qwen3_tts.py", "ROPE_INIT_FUNCTIONS[self.rope_type]", "_default_rope",
     "transformers 5 has no 'default' entry in ROPE_INIT_FUNCTIONS (models compute it themselves)"),
    ("core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py", "ROPE_INIT_FUNCTIONS[self.rope_type]",
     "_default_rope", "the same"),
    ("inference/qwen3_tts_tokenizer.py",
     "        AutoConfig.register(\"qwen3_tts_tokenizer_25hz\", Qwen3TTSTokenizerV1Config)\n"
     "        AutoModel.register(Qwen3TTSTokenizerV1Config, Qwen3TTSTokenizerV1Model)\n", "",
     "the 25 Hz tokenizer is not vendored"),
    ("inference/qwen3_tts_tokenizer.py",
     "        AutoConfig.register(\"qwen3_tts_tokenizer_12hz\", Qwen3TTSTokenizerV2Config)\n"
     "        AutoModel.register(Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model)\n",
     "        AutoConfig.register(\"qwen3_tts_tokenizer_12hz\", Qwen3TTSTokenizerV2Config, exist_ok=True)\n"
     "        AutoModel.register(Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model, exist_ok=True)\n",
     "loading two checkpoints in one process registers the classes twice"),
    ("core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py",
     "        self.upsample = None\n        self.decoder_transformer = None\n        self.decoder = None\n",
     "        self.decoder = None\n",
     "transformers 5's MimiModel holds its decoder half as one `decoder` (the others are read-only properties); "
     "the encoder is not run by these tests"),
    # transformers 5's create_causal_mask(config, inputs_embeds, attention_mask, cache, position_ids):
    ("core/models/modeling_qwen3_tts.py",
     "            input_embeds=inputs_embeds,\n            attention_mask=attention_mask,\n"
     "            cache_position=cache_position,\n            past_key_values=past_key_values,\n",
     "            inputs_embeds=inputs_embeds,\n            attention_mask=attention_mask,\n"
     "            cache=past_key_values,\n", "create_causal_mask's keywords (talker)"),
    ("core/models/modeling_qwen3_tts.py",
     '''                "input_embeds": inputs_embeds,
                "attention_mask": attention_mask,
                "cache_position": cache_position,
                "past_key_values": past_key_values,
            }''',
     '''                "inputs_embeds": inputs_embeds,
                "attention_mask": attention_mask,
                "cache": past_key_values,
                "position_ids": position_ids,
            }''', "create_causal_mask's keywords (code predictor)"),
    ("core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py",
     '''                "input_embeds": inputs_embeds,
                "attention_mask": attention_mask,
                "cache_position": cache_position,
                "past_key_values": past_key_values,
''',
     '''                "inputs_embeds": inputs_embeds,
                "attention_mask": attention_mask,
                "cache": past_key_values,
''', "create_causal_mask's keywords (codec decoder)"),
    # transformers 5's generate passes the KV cache as `cache` and no `cache_position`; outputs name it `cache`.
    ("core/models/modeling_qwen3_tts.py", "    past_key_values: Optional[list[torch.FloatTensor]] = None\n",
     "    cache: Optional[list[torch.FloatTensor]] = None\n", "ModelOutput fields are named `cache`"),
    ("core/models/modeling_qwen3_tts.py",
     "        past_key_values=None,\n        inputs_embeds=None,\n        labels=None,\n",
     "        cache=None,\n        inputs_embeds=None,\n        labels=None,\n",
     "generate passes `cache` (the talker's and code predictor's forward; forward_finetune is not run)"),
    ("core/models/modeling_qwen3_tts.py",
     "        # Prefill\n        if inputs_embeds is not None and inputs_embeds.shape[1] > 1:\n",
     CACHE_POSITION + "        # Prefill\n        if inputs_embeds is not None and inputs_embeds.shape[1] > 1:\n",
     "the talker reads cache_position (its rope deltas), which generate no longer passes"),
    ("core/models/modeling_qwen3_tts.py",
     "        # Prefill stage\n        if inputs_embeds is not None and inputs_embeds.shape[1] > 1:\n",
     CACHE_POSITION + "        # Prefill stage\n        if inputs_embeds is not None and inputs_embeds.shape[1] > 1:\n",
     "the same for the code predictor"),
)

# Appended to the modules above that use it: transformers 4's "default" rope init, verbatim in effect.
DEFAULT_ROPE = '''

def _default_rope(config, device=None):
    base = config.rope_theta
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq, 1.0
'''


def _pick(name: str) -> str | None:
    return name.removeprefix("qwen_tts/") if name.removeprefix("qwen_tts/") in FILES else None


def load_reference(cache: Path):
    """The vendored `qwen_tts` package (adapted), importable as `_qwen_tts_reference`."""
    empty = [f"{sub}__init__.py" for sub in ("", "core/", "core/models/", "core/tokenizer_12hz/", "inference/")]
    appends = {name: DEFAULT_ROPE for name, _, new, _ in ADAPTATIONS if new == "_default_rope"}
    return vendor(cache, WHEEL, PACKAGE, _pick, ADAPTATIONS, empty=empty, appends=appends)


def reference_model(cache: Path, model_path: str):
    """The authors' `Qwen3TTSModel` wrapper over the zoo checkpoint (fp32, CPU, SDPA)."""
    import torch
    from transformers import AutoTokenizer

    load_reference(cache)
    modeling = importlib.import_module(f"{PACKAGE}.core.models.modeling_qwen3_tts")
    configuration = importlib.import_module(f"{PACKAGE}.core.models.configuration_qwen3_tts")
    processing = importlib.import_module(f"{PACKAGE}.core.models.processing_qwen3_tts")
    wrapper = importlib.import_module(f"{PACKAGE}.inference.qwen3_tts_model")
    config = configuration.Qwen3TTSConfig.from_pretrained(model_path)
    model = modeling.Qwen3TTSForConditionalGeneration.from_pretrained(
        model_path, config=config, dtype=torch.float32, attn_implementation="sdpa", local_files_only=True)
    processor = processing.Qwen3TTSProcessor(tokenizer=AutoTokenizer.from_pretrained(model_path))
    _load_mimi_encoder(model.speech_tokenizer.model.encoder, model_path)
    _init_rotary(model)
    # The speech tokenizer is a plain attribute (a wrapper, not a submodule), so `model.modules()`
    # does not reach its decoder's rotary embeddings: they were left uninitialized memory, which
    # now and then made the reference's decoded audio all NaN.
    _init_rotary(model.speech_tokenizer.model)
    return wrapper.Qwen3TTSModel(model.eval(), processor, model.generate_config)


def _init_rotary(model) -> None:
    """transformers 5 builds the model on the meta device and materializes its non-persistent
    buffers empty: the reference's rotary `inv_freq` would be uninitialized memory (different in
    each run). Recompute them as the modules' own __init__ does."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "inv_freq") and hasattr(module, "rope_init_fn"):
                inv_freq, module.attention_scaling = module.rope_init_fn(module.config, module.inv_freq.device)
                module.inv_freq.copy_(inv_freq)
                module.original_inv_freq = module.inv_freq


def _load_mimi_encoder(encoder, model_path: str) -> None:
    """The speech tokenizer's encoder weights, stored under transformers 4's Mimi names, which the
    reference's transformers-5 Mimi (a `MimiModel` subclass) does not map on load."""
    from safetensors.torch import load_file

    from omnistage.models.qwen3_tts.modeling import MIMI_4_NAMES

    weights = {}
    for key, value in load_file(f"{model_path}/speech_tokenizer/model.safetensors").items():
        for new, old in MIMI_4_NAMES:
            if key.startswith("encoder." + old):
                weights[new + key[len("encoder." + old):]] = value
                break
    missing, unexpected = encoder.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.startswith("decoder.") for k in missing), (missing[:3], unexpected[:3])
