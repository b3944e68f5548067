"""Loading one Qwen2.5-Omni stage from the full checkpoint, and the speaker file.

The checkpoint holds all three sub-models under the prefixes `thinker.`, `talker.` and
`token2wav.`. The thinker class loads its own weights from the full folder (it ignores
the other prefixes). The talker and token2wav classes are subclassed here only to tell
transformers' loader which prefix is theirs and which keys to skip: the talker's report
would otherwise list every thinker and token2wav weight as unexpected, and
`Qwen2_5OmniToken2WavModel.from_pretrained(full)` silently random-initialises every
weight because it does not strip `token2wav.` (reference doc, obstacle 9).

`spk_dict.pt` maps a voice name to its talker text-BOS id (`bos_token`, a thinker-vocab
id), its DiT speaker embedding (`cond`) and its reference mel (`ref_mel`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from transformers import (
    Qwen2_5OmniTalkerForConditionalGeneration,
    Qwen2_5OmniThinkerForConditionalGeneration,
    Qwen2_5OmniToken2WavModel,
)

SPEAKER_FILE = "spk_dict.pt"


class _TalkerWeights(Qwen2_5OmniTalkerForConditionalGeneration):
    # base_model_prefix is already "talker"; only the other sub-models need skipping.
    _keys_to_ignore_on_load_unexpected = [r"^thinker\.", r"^token2wav\."]


class _Token2WavWeights(Qwen2_5OmniToken2WavModel):
    base_model_prefix = "token2wav"
    _keys_to_ignore_on_load_unexpected = [r"^thinker\.", r"^talker\."]


def load_thinker(model_path: str, device: torch.device, dtype: torch.dtype):
    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
        model_path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def load_talker(model_path: str, device: torch.device, dtype: torch.dtype):
    model = _TalkerWeights.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def load_token2wav(model_path: str, device: torch.device):
    # fp32 whatever the stage dtype: the reference runs token2wav in fp32 (`self.token2wav.float()`).
    model = _Token2WavWeights.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    return model.to(device).eval()


@lru_cache(maxsize=4)
def load_speakers(model_path: str) -> dict[str, dict[str, Any]]:
    """The checkpoint's voices: {name: {"bos_token": int, "cond": Tensor, "ref_mel": Tensor}}."""
    from transformers.utils import cached_file

    path = cached_file(model_path, SPEAKER_FILE)
    return torch.load(path, weights_only=True, map_location="cpu")

