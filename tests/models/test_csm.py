"""CSM end to end on the tiny zoo checkpoint: parity with transformers' own `generate`
(codes and waveform, greedy, with and without a cloned voice), streaming, batching, metrics."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, Omni
from omnistage.ar import SamplingParams
from omnistage.ar.engine import AREngine
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import StageRequest
from omnistage.media.audio import resample
from omnistage.models.csm import CSM, CsmCodecParams
from omnistage.models.csm.prompt import parse_prompt
from omnistage.testing.speech_models import DEFAULT_GENERATE_KWARGS

TEXT = "Hello there. How are you today?"
REF_TEXT = "This is my voice."
NUM_FRAMES = DEFAULT_GENERATE_KWARGS["csm"]["max_new_tokens"]
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_FRAMES)
BATCH = {"*": {"max_num_seqs": 4}}


@pytest.fixture(scope="module")
def csm(zoo):
    return str(zoo("csm"))


@pytest.fixture(scope="module")
def reference(csm):
    from transformers import AutoProcessor, CsmForConditionalGeneration

    model = CsmForConditionalGeneration.from_pretrained(csm).eval()
    processor = AutoProcessor.from_pretrained(csm)

    def generate(conversation):
        inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        with torch.inference_mode():
            out = model.generate(**inputs, **DEFAULT_GENERATE_KWARGS["csm"], return_dict_in_generate=True)
        return out.sequences[0], out.audio[0].numpy()

    return generate


@pytest.fixture(scope="module")
def omni(csm):
    with Omni(csm, stage_overrides=BATCH) as omni:
        yield omni


def _clip(rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.RandomState(0).randn(t.size)).astype(np.float32)


def _talker_codes(path: str, prompts: list) -> tuple[list[torch.Tensor], int]:
    """Each prompt's frames from the talker's AR engine alone, run as one batch; and the largest batch."""
    engine = AREngine(path, CSM.stages[0], StageDeployConfig(max_num_seqs=len(prompts)))
    for i, prompt in enumerate(prompts):
        engine.add_request(StageRequest(str(i), prompt, GREEDY))
    codes, largest = {}, 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        largest = max(largest, len(outputs))
        for out in outputs:
            if out.finished:
                codes[out.request_id] = out.payload.extras["audio_codes"]
    engine.close()
    return [codes[str(i)] for i in range(len(prompts))], largest


def test_codes_and_waveform_match_transformers_generate(csm, reference, omni):
    # The cloned voice's clip is at 16 kHz: the model resamples it to the codec's 24 kHz.
    clip16 = _clip(16000)
    cloned = {"prompt": TEXT, "ref_audio": clip16, "ref_sample_rate": 16000, "ref_text": REF_TEXT}
    ref_plain = reference([{"role": "0", "content": [{"type": "text", "text": TEXT}]}])
    ref_cloned = reference([
        {"role": "0", "content": [{"type": "text", "text": REF_TEXT},
                                  {"type": "audio", "path": resample(clip16, 16000, 24000)}]},
        {"role": "0", "content": [{"type": "text", "text": TEXT}]},
    ])
    codes, batch_size = _talker_codes(csm, [TEXT, cloned])
    assert batch_size == 2  # both requests in every step (the prompts have different lengths)
    for ours, (ref_codes, _) in zip(codes, (ref_plain, ref_cloned)):
        assert torch.equal(ours, ref_codes)
    assert not torch.equal(codes[0], codes[1])  # the reference clip changes the speech

    # The codec decodes the streamed chunks (2 frames, then 8) with state carried over:
    # the same waveform as the reference's one-shot Mimi decode.
    outputs = omni.generate([{"prompt": TEXT, "voice": "alloy"}, cloned], {"talker": GREEDY}, use_tqdm=False)
    for out, (_, ref_audio) in zip(outputs, (ref_plain, ref_cloned)):
        assert out.sample_rate == 24000 and out.audio.dtype == np.float32
        assert out.audio.shape == ref_audio.shape
        np.testing.assert_allclose(out.audio, ref_audio, atol=1e-4 * np.abs(ref_audio).max())


def test_chunk_sizes_do_not_change_the_waveform(omni):
    params = [{"talker": GREEDY, "codec": CsmCodecParams(first_chunk_frames=f, chunk_frames=c)}
              for f, c in ((1, 1), (3, 2), (NUM_FRAMES, NUM_FRAMES))]
    audios = [omni.generate(TEXT, p, use_tqdm=False)[0].audio for p in params]
    for audio in audios[:-1]:
        np.testing.assert_allclose(audio, audios[-1], atol=1e-5 * np.abs(audios[-1]).max())


def test_first_audio_streams_before_the_talker_ends(csm):
    long_run = SamplingParams(temperature=0, max_tokens=24)
    params = {"talker": long_run, "codec": CsmCodecParams(first_chunk_frames=2, chunk_frames=4)}

    async def run():
        chunks, first_chunk_time = [], None
        async with AsyncOmni(csm) as engine:
            async for out in engine.generate(TEXT, params):
                if out.audio_chunk is not None:
                    first_chunk_time = first_chunk_time or time.monotonic()
                    chunks.append(out.audio_chunk)
                last = out
        return chunks, first_chunk_time, last

    chunks, first_chunk_time, last = asyncio.run(run())
    talker = last.metrics["stages"]["talker"]
    assert first_chunk_time < talker["finish_time"]
    assert len(chunks) >= 5  # 2 frames, then 4 at a time: 24 frames are 6 chunks
    assert len(chunks[0]) == 2 * 1920  # Mimi: 1920 samples per frame
    np.testing.assert_array_equal(np.concatenate(chunks), last.audio)
    assert len(last.audio) == 24 * 1920
    # TTFP and RTF on the output
    metrics = last.metrics
    assert 0 < metrics["time_to_first_audio"] < metrics["e2e_time"]
    assert metrics["audio_seconds"] == pytest.approx(24 * 1920 / 24000)
    assert metrics["real_time_factor"] == pytest.approx(metrics["e2e_time"] / metrics["audio_seconds"])


def test_concurrent_requests_match_single_runs(omni):
    prompts = [TEXT, "Short.", {"prompt": "A third, rather longer sentence to speak.", "voice": "nova"}]
    alone = [omni.generate(p, {"talker": GREEDY}, use_tqdm=False)[0] for p in prompts]
    together = omni.generate(prompts, {"talker": GREEDY}, use_tqdm=False)
    for a, b in zip(alone, together):
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-4 * np.abs(a.audio).max())
    # They ran at once: each talker run started before any of them finished.
    talkers = [out.metrics["stages"]["talker"] for out in together]
    assert max(t["start_time"] for t in talkers) < min(t["finish_time"] for t in talkers)


def test_audio_metrics_are_exported(omni):
    from prometheus_client import generate_latest

    omni.generate(TEXT, {"talker": GREEDY}, use_tqdm=False)
    text = generate_latest(omni.async_omni.metrics_registry).decode()
    assert 'omnistage_request_time_to_first_audio_seconds_count{pipeline="csm"}' in text
    assert 'omnistage_request_real_time_factor_count{pipeline="csm"}' in text


@pytest.mark.parametrize("prompt, problem", [
    ({"prompt": "hi", "voice": "nobody"}, "voice: unknown voice 'nobody'"),
    ({"prompt": "hi", "instructions": "whisper"}, "instructions:"),
    ({"prompt": ""}, "prompt:"),
    ({"prompt": "hi", "ref_audio": np.zeros((2, 10), np.float32), "ref_sample_rate": 24000}, "ref_audio:"),
    ({"prompt": "hi", "ref_audio": np.zeros(10, np.float32)}, "ref_sample_rate:"),
    ({"prompt": "hi", "ref_text": "words"}, "ref_text: goes with ref_audio"),
    ({"prompt": "hi", "speed": 2}, "speed: unknown CSM prompt key"),
])
def test_bad_prompts_name_the_key(prompt, problem):
    with pytest.raises(ValueError, match=problem):
        parse_prompt(prompt)


def test_bad_prompt_fails_only_its_request(omni):
    with pytest.raises(Exception, match="voice: unknown voice"):
        omni.generate({"prompt": "hi", "voice": "nobody"}, {"talker": GREEDY}, use_tqdm=False)
    assert omni.generate("hi", {"talker": GREEDY}, use_tqdm=False)[0].audio.size == NUM_FRAMES * 1920


def test_prepacked_linears_keep_the_codes_and_waveform(csm, reference, monkeypatch):
    """On CPU the backbone's, depth decoder's and Mimi's linear layers run through oneDNN with
    prepacked weights (core/cpu_linear.py); the zoo model's are all below the size where that
    pays, so this packs every one of them: the same frames as transformers, and its waveform up
    to rounding."""
    from packed_linears import assert_every_stage_packed, pack_every_linear

    pack_every_linear(monkeypatch)
    ref_codes, ref_audio = reference([{"role": "0", "content": [{"type": "text", "text": TEXT}]}])
    with Omni(csm) as packed:
        assert_every_stage_packed(packed)
        [out] = packed.generate({"prompt": TEXT, "voice": "alloy"}, {"talker": GREEDY}, use_tqdm=False)
    [codes], _ = _talker_codes(csm, [TEXT])
    assert torch.equal(codes, ref_codes)
    assert out.audio.shape == ref_audio.shape
    np.testing.assert_allclose(out.audio, ref_audio, atol=1e-4 * np.abs(ref_audio).max())
