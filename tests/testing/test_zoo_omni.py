"""The Qwen3-Omni zoo checkpoint: it loads in its reference class and generates text and audio,
and the same (size, seed) always writes the same bytes."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import torch

from omnistage.testing import build
from omnistage.testing.omni_models import QWEN3_OMNI_GENERATE_KWARGS, QWEN3_OMNI_SAMPLE_RATE

SAMPLES_PER_FRAME = QWEN3_OMNI_SAMPLE_RATE * 2 // 25  # code2wav at 12.5 frames/s


def _digests(folder: Path) -> dict[str, str]:
    # `.complete` is the cache's own marker (zoo.ensure), not part of a build.
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.name != ".complete"}


def test_qwen3_omni_generates_text_and_audio(zoo):
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    path = zoo("qwen3-omni")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).eval()
    assert model.dtype == torch.float32
    tok = AutoTokenizer.from_pretrained(path)
    inputs = tok.apply_chat_template([{"role": "user", "content": "Hello world"}], add_generation_prompt=True,
                                     return_dict=True, return_tensors="pt")
    assert [tok.convert_ids_to_tokens(int(t)) for t in inputs["input_ids"][0, :2]] == ["<|im_start|>", "user"]
    with torch.inference_mode():
        ids, wav = model.generate(**inputs, **QWEN3_OMNI_GENERATE_KWARGS)
    assert ids.shape[1] > inputs["input_ids"].shape[1]
    frames = QWEN3_OMNI_GENERATE_KWARGS["talker_max_new_tokens"]
    assert 0 < wav.numel() <= frames * SAMPLES_PER_FRAME and wav.abs().max() > 0


def test_qwen3_omni_build_is_byte_deterministic_and_small(zoo, tmp_path):
    # The seed-0 build the session's cache holds (zoo.ensure ran `build`) against one in a fresh
    # process: its own hash seed and torch.save state, as a build on another machine would have.
    build("qwen3-omni", tmp_path / "s1", seed=1)
    script = "import sys; from omnistage.testing import build; build('qwen3-omni', sys.argv[1], seed=0)"
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "again")], check=True, capture_output=True)
    first = _digests(zoo("qwen3-omni"))
    assert first == _digests(tmp_path / "again")
    other = _digests(tmp_path / "s1")
    assert {f for f in first if first[f] != other[f]} == {"model.safetensors"}
    assert sum(p.stat().st_size for p in (tmp_path / "again").iterdir()) < 10_000_000
