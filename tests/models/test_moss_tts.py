"""MOSS-TTS on the tiny zoo checkpoint: parity with the authors' `moss-tts-lite` (codes and
waveform, same seed), alone and batched, plain, with a language and with a described voice;
streamed audio equals the authors' one-shot decode, of each block when a reply has two;
prompts.

The reference is the authors' package, vendored at test time (tests/models/moss_tts_reference.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage import Omni
from omnistage.ar import SamplingParams
from omnistage.ar.engine import AREngine
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.errors import RequestError
from omnistage.core.types import StageRequest
from omnistage.models.moss_tts import MOSS_TTS
from omnistage.models.moss_tts.prompt import parse_prompt
from omnistage.models.qwen3_omni.params import Code2WavParams
from moss_tts_reference import module

REFERENCE_CACHE = Path(__file__).resolve().parents[2] / ".omnistage-cache"

MAX_STEPS = 48
TEXT = "Hello world! How are you today?"
PROMPTS = (TEXT, {"prompt": "The sun rises in the east.", "language": "English"},
           {"prompt": "Please describe the image in one sentence.", "instructions": "a calm, deep voice"}, TEXT)
SEEDS = (0, 1, 5, 0)
TEMPERATURES = (1.7, 1.7, 1.7, 0.0)  # the authors' audio temperature; 0: their greedy
PENALTIES = (1.0, 1.0, 1.3, 1.0)  # the authors' audio repetition penalty


@pytest.fixture(scope="module")
def moss_tts(zoo):
    return str(zoo("moss-tts"))


@pytest.fixture(scope="module")
def reference(moss_tts):
    """Each prompt's (delayed rows, waveform) from the authors' eager `generate` and codec, seeded."""
    from safetensors.torch import load_file

    generate, prompt, codec, model, bpe, normalizer = (
        module(REFERENCE_CACHE, m) for m in ("generate", "prompt", "codec", "model", "bpe", "normalizer"))
    weights = load_file(f"{moss_tts}/model.safetensors")
    ref = model.MossTTSModel(weights, device="cpu", dtype=torch.float32, max_seq_len=512)
    assert len(weights) == sum(1 for _ in ref.layers for _ in model._PARTS) + 2 + 2 * model.N_VQ + 1
    tok = bpe.QwenBPE(f"{moss_tts}/vocab.json", f"{moss_tts}/merges.txt", f"{moss_tts}/tokenizer.json")
    decoder = codec.MossCodecDecoder(f"{moss_tts}/MOSS-Audio-Tokenizer", device="cpu")
    results = []
    for p, seed, temperature, penalty in zip(PROMPTS, SEEDS, TEMPERATURES, PENALTIES):
        p = p if isinstance(p, dict) else {"prompt": p}
        if "instructions" in p:  # the authors' prompt builder with its Instruction field set
            ids = tok.encode(prompt._apply_chat_template_user(prompt._render_user_inst(
                normalizer.normalize_tts_text(p["prompt"]), instruction=p["instructions"])))
            inputs = {"input_ids": prompt._unified(ids)}
        else:
            inputs = prompt.build_tts_prompt(p["prompt"], language=p.get("language"), tokenizer=tok)
        res = generate.generate(ref, inputs, max_new_tokens=MAX_STEPS, seed=seed, greedy=temperature == 0,
                                audio_repetition_penalty=penalty)
        segments = codec.delayed_rows_to_segments(res.audio_frames)
        wav = np.concatenate([decoder.decode(s) for s in segments])
        results.append((res, segments, wav))
    return results


def _talker(engine: AREngine, count: int) -> tuple[list, int]:
    """The first `count` prompts' frames from the talker's AR engine alone, run as one batch; and the largest batch."""
    for i in range(count):
        params = SamplingParams(temperature=TEMPERATURES[i], top_p=0.8, top_k=25, max_tokens=MAX_STEPS, seed=SEEDS[i],
                                repetition_penalty=PENALTIES[i])
        engine.add_request(StageRequest(str(i), PROMPTS[i], params))
    frames, largest = {}, 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        largest = max(largest, len(outputs))
        for out in outputs:
            if out.finished:
                frames[out.request_id] = out.payload.extras["audio_codes"]
    return [frames[str(i)] for i in range(count)], largest


def _blocks(frames: torch.Tensor) -> list[torch.Tensor]:
    """Our frames split at the all-padding break frames."""
    brk = (frames == 1024).all(dim=1)
    out, cur = [], []
    for f, b in zip(frames, brk.tolist()):
        if b:
            out.append(torch.stack(cur)) if cur else None
            cur = []
        else:
            cur.append(f)
    return out + ([torch.stack(cur)] if cur else [])


def test_codes_and_waveform_match_the_authors(moss_tts, reference):
    # Greedy never takes the delay slot here: its reply runs out of steps mid-audio.
    assert [[s.shape[0] for s in segments] for _, segments, _ in reference] == [[5], [9], [9], [16]]
    engine = AREngine(moss_tts, MOSS_TTS.stages[0], StageDeployConfig(max_num_seqs=4))
    assert engine.model.audio_frame_rate == 24000 / 1920  # the codec's frames: deadline order counts them
    [alone], _ = _talker(engine, 1)
    assert [torch.equal(a, b) for a, b in zip(_blocks(alone), reference[0][1])] == [True]
    batched, largest = _talker(engine, len(PROMPTS))
    engine.close()
    assert largest == len(PROMPTS)  # all in every step (the prompts differ in length)
    for ours, (_, segments, _) in zip(batched, reference):
        blocks = _blocks(ours)
        assert len(blocks) == len(segments) and all(torch.equal(a, b) for a, b in zip(blocks, segments))

    # The codec decodes the streamed chunks (1 frame, then 2 at a time) with its attention
    # window's keys only: the authors' one-shot decode.
    with Omni(moss_tts, stage_overrides={"*": {"max_num_seqs": 4}}) as omni:
        params = [{"talker": SamplingParams(max_tokens=MAX_STEPS, seed=seed), "codec": Code2WavParams(1, 2)}
                  for seed in SEEDS[:2]]
        outputs = omni.generate(list(PROMPTS[:2]), params, use_tqdm=False)
    for out, (_, segments, wav) in zip(outputs, reference):
        assert out.sample_rate == 24000 and out.audio.dtype == np.float32
        assert out.audio.shape == wav.shape == (sum(s.shape[0] for s in segments) * 1920,)
        np.testing.assert_allclose(out.audio, wav, atol=1e-5 * np.abs(wav).max())


def test_two_audio_blocks_reach_the_codec_apart():
    """A reply with two audio blocks (padding rows between): the talker's frames are the authors'
    blocks (`delayed_rows_to_segments`), the second after an all-padding break frame."""
    from omnistage.models.moss_tts.talker import DelayState

    prompt, codec = module(REFERENCE_CACHE, "prompt"), module(REFERENCE_CACHE, "codec")
    g = torch.Generator().manual_seed(0)
    blocks = [torch.randint(0, 1024, (n, 32), generator=g) for n in (4, 3)]
    pad = torch.full((2, 32), 1024)
    rows = torch.cat([pad[:1], prompt.apply_delay_pattern(blocks[0]), pad, prompt.apply_delay_pattern(blocks[1]), pad])
    state = DelayState()
    added = [state.add_row(row) for row in rows]
    assert added.count(2) == 1 and sum(added) == state.num_frames == 4 + 1 + 3  # the break goes with a frame; none after
    ours = _blocks(state.codes())
    reference = codec.delayed_rows_to_segments(rows)
    assert len(ours) == len(reference) == 2 and all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_codec_restarts_at_a_new_audio_block(moss_tts):
    """A reply with two audio blocks: the authors decode each on its own; the talker marks the
    second's start with an all-padding frame, where the codec stream restarts."""
    from omnistage.models.moss_tts.codec import MossCodec

    decoder = module(REFERENCE_CACHE, "codec").MossCodecDecoder(f"{moss_tts}/MOSS-Audio-Tokenizer", device="cpu")
    g = torch.Generator().manual_seed(0)
    blocks = [torch.randint(0, 1024, (n, 32), generator=g) for n in (11, 6)]
    codec = MossCodec.load(moss_tts, None, torch.device("cpu"), torch.float32, 1)
    stream = codec.open_stream()
    codes = codec.parse(torch.cat([blocks[0], torch.full((1, 32), 1024), blocks[1]]))
    ours = np.concatenate([codec.decode([part], [stream])[0] for part in codes.split(5)])
    wav = np.concatenate([decoder.decode(b) for b in blocks])
    np.testing.assert_allclose(ours, wav, atol=1e-5 * np.abs(wav).max())
    with pytest.raises(ValueError, match="padding code"):
        codec.parse(torch.cat([blocks[0][:1, :31], torch.full((1, 1), 1024)], dim=1))


@pytest.mark.parametrize("prompt, param", [
    ({"prompt": " \n "}, "prompt"),
    ({"prompt": "hi", "language": ""}, "language"),
    ({"prompt": "hi", "instructions": 3}, "instructions"),
    ({"prompt": "hi", "ref_audio": np.zeros(100, np.float32), "ref_sample_rate": 16000}, "ref_audio"),
    ({"prompt": "hi", "ref_text": "words"}, "ref_text"),
    ({"prompt": "hi", "speed": 2}, "speed"),
    (["hi"], "prompt"),
])
def test_bad_prompts_name_the_key(prompt, param):
    with pytest.raises(RequestError) as info:
        parse_prompt(prompt)
    assert info.value.param == param


def test_prompt_is_the_authors_user_turn():
    text = parse_prompt({"prompt": "Hi   there -> you", "language": "English", "instructions": "warm"}).render()
    assert text.startswith("<|im_start|>user\n<user_inst>\n- Reference(s):\nNone\n- Instruction:\nwarm\n")
    assert text.endswith("- Language:\nEnglish\n- Text:\nHi there，you\n</user_inst><|im_end|>\n<|im_start|>assistant\n")
