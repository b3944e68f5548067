"""The AR / omni / speech half of the zoo: each checkpoint loads in its reference class and
generates, and the same (name, size, seed) always writes the same bytes (Qwen3-Omni's too,
whose generation test_zoo_omni.py runs)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnistage.testing import build
from omnistage.testing.speech_models import (
    CSM_SAMPLE_RATE,
    DEFAULT_GENERATE_KWARGS,
    OMNI_CODEC_EOS,
    OMNI_CODEC_PAD,
    QWEN2_VOCAB,
)

OMNI_SAMPLES_PER_CODE = 480  # BigVGAN hop 240 x DiT repeats 2
CSM_SAMPLES_PER_FRAME = CSM_SAMPLE_RATE * 2 // 25  # Mimi at 12.5 frames/s


def _chat(tokenizer, text: str) -> dict:
    messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")


def _digests(folder: Path) -> dict[str, str]:
    # `.complete` is the cache's own marker (zoo.ensure), not part of a build.
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.name != ".complete"}


def test_qwen2_llm_chat_template_and_generation_config(zoo):
    from transformers import AutoTokenizer, GenerationConfig

    path = zoo("qwen2-llm")
    tok = AutoTokenizer.from_pretrained(path)
    text = tok.apply_chat_template([{"role": "user", "content": "Hello world"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    gen = GenerationConfig.from_pretrained(path)
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert gen.eos_token_id == [im_end, endoftext]
    assert gen.pad_token_id == endoftext == tok.pad_token_id
    assert tok.eos_token == "<|im_end|>"
    assert len(tok) <= QWEN2_VOCAB


def test_qwen2_llm_generates(zoo):
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    path = zoo("qwen2-llm")
    model = Qwen2ForCausalLM.from_pretrained(path).eval()
    assert model.dtype == torch.float32
    assert model.config.head_dim >= 32  # vLLM's CPU attention rejects smaller heads
    inputs = _chat(AutoTokenizer.from_pretrained(path), "Hello world")
    out = model.generate(**inputs, **DEFAULT_GENERATE_KWARGS["qwen2-llm"])
    prompt_len = inputs["input_ids"].shape[1]
    assert out.dtype == torch.long
    assert prompt_len < out.shape[1] <= prompt_len + DEFAULT_GENERATE_KWARGS["qwen2-llm"]["max_new_tokens"]
    assert int(out.max()) < QWEN2_VOCAB


def test_qwen25_omni_generates_text_and_audio(zoo):
    from transformers import AutoFeatureExtractor, AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    path = zoo("qwen2.5-omni")
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(path).eval()
    assert set(model.speaker_map) == {"Chelsie", "Ethan"}
    assert AutoFeatureExtractor.from_pretrained(path).feature_size == 128
    inputs = _chat(AutoTokenizer.from_pretrained(path), "Hello world")
    kwargs = DEFAULT_GENERATE_KWARGS["qwen2.5-omni"]
    torch.manual_seed(0)  # token2wav samples its mel from noise
    text_ids, wav = model.generate(**inputs, **kwargs)
    prompt_len = inputs["input_ids"].shape[1]
    assert text_ids.dtype == torch.long
    assert prompt_len < text_ids.shape[1] <= prompt_len + kwargs["thinker_max_new_tokens"]
    assert wav.dtype == torch.float32 and wav.dim() == 1
    assert 0 < wav.numel() <= kwargs["talker_max_new_tokens"] * OMNI_SAMPLES_PER_CODE
    assert wav.numel() % OMNI_SAMPLES_PER_CODE == 0
    assert kwargs["talker_eos_token_id"] == [OMNI_CODEC_PAD, OMNI_CODEC_EOS]


def test_csm_generates_audio(zoo):
    from transformers import AutoProcessor, CsmForConditionalGeneration

    path = zoo("csm")
    model = CsmForConditionalGeneration.from_pretrained(path).eval()
    processor = AutoProcessor.from_pretrained(path)
    conversation = [{"role": "0", "content": [{"type": "text", "text": "The sun rises in the east."}]}]
    inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
    kwargs = DEFAULT_GENERATE_KWARGS["csm"]
    audio = model.generate(**inputs, **kwargs)
    assert isinstance(audio, list) and len(audio) == 1
    wav = audio[0]
    assert wav.dtype == torch.float32 and wav.dim() == 1
    assert 0 < wav.numel() <= kwargs["max_new_tokens"] * CSM_SAMPLES_PER_FRAME


def test_builds_are_byte_deterministic(zoo, tmp_path):
    names = ["qwen2-llm", "qwen2.5-omni", "qwen3-omni"]  # one fresh process for all: its imports cost ~8 s CPU
    for name in names:
        build(name, tmp_path / "s1" / name, seed=1)
    # The second seed-0 build runs in a fresh process: its own hash seed, tokenizer trainer
    # and torch.save state, as a build on another machine would have.
    script = (
        "import sys; from omnistage.testing import build\n"
        "for name in sys.argv[2:]: build(name, f'{sys.argv[1]}/{name}', seed=0)"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "again"), *names], check=True,
                   capture_output=True)
    for name in names:
        first = _digests(zoo(name))  # the seed-0 build the session's cache holds (zoo.ensure ran `build`)
        assert first == _digests(tmp_path / "again" / name), name
        other = _digests(tmp_path / "s1" / name)
        assert first.keys() == other.keys()
        changed = {f for f in first if first[f] != other[f]}
        expected = {"model.safetensors", "spk_dict.pt"} if name == "qwen2.5-omni" else {"model.safetensors"}
        assert changed == expected, name


@pytest.mark.parametrize("name", ["qwen2-llm", "qwen2.5-omni", "qwen3-omni", "csm", "moshi"])
def test_checkpoints_are_small(zoo, name):
    size = sum(p.stat().st_size for p in zoo(name).iterdir())
    assert size < 10_000_000
