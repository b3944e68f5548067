"""Loading one Qwen3-Omni stage from the full checkpoint.

The checkpoint holds the sub-models under the prefixes `thinker.`, `talker.` and
`code2wav.`. The thinker class loads its own weights from the full folder (it ignores the
other prefixes). The talker and code2wav classes are subclassed here only to tell
transformers' loader which prefix is theirs, which keys to skip and (talker) how its MoE
experts are stored, as for Qwen2.5-Omni (`models/qwen2_5_omni/weights.py`).

Voices are not a separate file here: `talker_config.speaker_id` maps a lower-case voice
name to its codec id.
"""

from __future__ import annotations

import torch
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers import (
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeTalkerForConditionalGeneration,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)


class _TalkerWeights(Qwen3OmniMoeTalkerForConditionalGeneration):
    _keys_to_ignore_on_load_unexpected = [r"^thinker\.", r"^code2wav\."]


# NOTE: checkpoints store MoE experts one by one (`experts.0.up_proj.weight`); transformers fuses
# them on load by a conversion registered for the top-level and thinker model types, not for the
# talker's. Register the same (Qwen2-MoE) conversion for this class by name: transformers' public
# registry, scoped to our subclass.
if get_checkpoint_conversion_mapping(_TalkerWeights.__name__) is None:
    register_checkpoint_conversion_mapping(_TalkerWeights.__name__, get_checkpoint_conversion_mapping("qwen2_moe"))


class _Code2WavWeights(Qwen3OmniMoeCode2Wav):
    base_model_prefix = "code2wav"
    _keys_to_ignore_on_load_unexpected = [r"^thinker\.", r"^talker\."]


def load_thinker(model_path: str, device: torch.device, dtype: torch.dtype):
    model = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
        model_path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def load_talker(model_path: str, device: torch.device, dtype: torch.dtype):
    model = _TalkerWeights.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def load_code2wav(model_path: str, device: torch.device):
    from transformers import Qwen3OmniMoeConfig

    # The sub-config is passed: this class would read the top-level config.json as its own.
    config = Qwen3OmniMoeConfig.from_pretrained(model_path).code2wav_config
    # fp32 whatever the stage dtype: the reference's waveform is `.float()` and the codec is small.
    model = _Code2WavWeights.from_pretrained(model_path, config=config, dtype=torch.float32,
                                             attn_implementation="sdpa")
    return model.to(device).eval()


def speaker_ids(talker_config) -> dict[str, int]:
    """{voice name (lower case): codec id} from the checkpoint's talker config."""
    return {name.lower(): int(codec_id) for name, codec_id in (talker_config.speaker_id or {}).items()}

