"""Qwen3-TTS end to end on the tiny zoo checkpoints: greedy code parity with the authors'
`qwen-tts` (CustomVoice and VoiceDesign, streaming and non-streaming text, languages, a
dialect speaker), the codec decoder against theirs, streamed audio against one-shot, the
speech route, and request checks.

The reference is the authors' package adapted to transformers 5 (tests/models/qwen3_tts_reference.py
lists every edit)."""

from __future__ import annotations

import base64
import dataclasses
import json
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
from omnistage.models.qwen3_tts import STAGES, Code2WavParams
from omnistage.models.qwen3_tts.prompt import parse_prompt
from qwen3_tts_reference import reference_model as _load_reference

# Where the reference wheel and its adapted copy are kept (beside the zoo cache).
REFERENCE_CACHE = Path(__file__).resolve().parents[2] / ".omnistage-cache"

FRAMES = 16
# The authors' generate always has min_new_tokens=2; repetition_penalty is their default.
GREEDY = SamplingParams(temperature=0, max_tokens=FRAMES, min_tokens=2, repetition_penalty=1.05)
TEXT = "Hello there, how are you?"


_REFERENCES: dict[str, object] = {}


def reference_model(cache: Path, path: str):
    """The authors' model over `path`, loaded once per test module run."""
    if path not in _REFERENCES:
        _REFERENCES[path] = _load_reference(cache, path)
    return _REFERENCES[path]


@pytest.fixture(scope="module")
def custom_voice(zoo):
    return str(zoo("qwen3-tts-custom-voice"))


@pytest.fixture(scope="module")
def voice_design(zoo):
    return str(zoo("qwen3-tts-voice-design"))


@pytest.fixture(scope="module")
def base(zoo):
    return str(zoo("qwen3-tts-base"))


@pytest.fixture(scope="module")
def omni(custom_voice):
    with Omni(custom_voice, stage_overrides={"*": {"max_num_seqs": 4}}) as omni:
        yield omni


def _reference_codes(ref, prompt: dict) -> torch.Tensor:
    """What the authors' `generate_custom_voice` / `generate_voice_design` feed `generate`, greedy."""
    ids = ref._tokenize_texts([ref._build_assistant_text(prompt["prompt"])])
    instruct = prompt.get("instructions")
    instruct_ids = [ref._tokenize_texts([ref._build_instruct_text(instruct)])[0] if instruct else None]
    kwargs = ref._merge_generate_kwargs(do_sample=False, subtalker_dosample=False, max_new_tokens=FRAMES,
                                        repetition_penalty=GREEDY.repetition_penalty)
    codes, _ = ref.model.generate(input_ids=ids, instruct_ids=instruct_ids, languages=[prompt.get("language", "auto")],
                                  speakers=[prompt.get("voice")],
                                  non_streaming_mode=prompt.get("non_streaming_mode", True), **kwargs)
    return codes[0]


def _clip(rate: int = 24000, seconds: float = 1.5, hz: float = 220) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t) + 0.05 * np.random.RandomState(0).randn(t.size)).astype(np.float32)


def _reference_clone_codes(ref, prompt: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the authors' `generate_voice_clone` feeds `generate` (the clip at 24 kHz: no resampling), greedy;
    and the reference codes it decodes before them."""
    ref_text = prompt.get("ref_text")
    items = ref.create_voice_clone_prompt(ref_audio=(prompt["ref_audio"], prompt["ref_sample_rate"]), ref_text=ref_text,
                                          x_vector_only_mode=ref_text is None)
    voice = ref._prompt_items_to_voice_clone_prompt(items)
    ref_ids = [ref._tokenize_texts([ref._build_ref_text(ref_text)])[0] if ref_text else None]
    kwargs = ref._merge_generate_kwargs(do_sample=False, subtalker_dosample=False, max_new_tokens=FRAMES,
                                        repetition_penalty=GREEDY.repetition_penalty)
    codes, _ = ref.model.generate(input_ids=ref._tokenize_texts([ref._build_assistant_text(prompt["prompt"])]),
                                  ref_ids=ref_ids, voice_clone_prompt=voice, languages=["auto"],
                                  non_streaming_mode=prompt.get("non_streaming_mode", False), **kwargs)
    return codes[0], voice["ref_code"][0]


def _talker_codes(path: str, prompts: list[dict]) -> tuple[list[torch.Tensor], int]:
    """Each prompt's frames from the talker's AR engine, run as one batch; and the largest batch."""
    engine = AREngine(path, STAGES[0], StageDeployConfig(max_num_seqs=len(prompts)))
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


def _assert_same_codes(ours: torch.Tensor, ref: torch.Tensor) -> None:
    # The reference builds a frame's codebooks 1.. at the next step, so its max_new_tokens-th frame is
    # never completed: it has one frame less (see qwen3_omni/talker.py). The rest is equal.
    assert ref.shape[0] >= FRAMES - 2 and ours.shape[0] == ref.shape[0] + 1
    assert torch.equal(ours[:ref.shape[0]], ref)


@pytest.mark.parametrize("which, prompts", [
    ("custom_voice", [
        {"prompt": TEXT, "voice": "vivian"},
        {"prompt": TEXT, "voice": "Ryan", "non_streaming_mode": False},  # text fed one token per frame
        {"prompt": "Good morning.", "voice": "dylan", "language": "chinese"},  # a dialect speaker
        {"prompt": "Good morning to you all.", "voice": "vivian", "language": "english"},
    ]),
    ("voice_design", [
        {"prompt": TEXT, "instructions": "A deep, calm voice, speaking slowly."},
        {"prompt": TEXT, "instructions": "A bright young voice.", "non_streaming_mode": False},
        {"prompt": "Good morning.", "language": "german"},  # no instructions: the model's own voice
    ]),
])
def test_greedy_codes_match_the_reference(request, which, prompts):
    path = request.getfixturevalue(which)
    ref = reference_model(REFERENCE_CACHE, path)
    # Alone, a request runs the reference's attention path (no padding mask): the same floats.
    alone = [_talker_codes(path, [prompt])[0][0] for prompt in prompts]
    for ours, prompt in zip(alone, prompts):
        _assert_same_codes(ours, _reference_codes(ref, prompt))
    assert not torch.equal(alone[0], alone[1])
    # In one batch (the prompts differ in length: padded, masked) each request makes the same codes.
    codes, largest = _talker_codes(path, prompts)
    assert largest == len(prompts)
    for ours, single in zip(codes, alone):
        assert torch.equal(ours, single)


def test_cloned_voice_codes_and_audio_match_the_reference(base):
    ref = reference_model(REFERENCE_CACHE, base)
    clip = {"ref_audio": _clip(), "ref_sample_rate": 24000}
    prompts = [
        {"prompt": TEXT, **clip, "ref_text": "This is my voice."},  # in context: the clip's codes and transcript
        {"prompt": TEXT, **clip},  # the speaker embedding alone
        {"prompt": TEXT, **clip, "ref_text": "This is my voice.", "non_streaming_mode": True},
        {"prompt": TEXT, "ref_audio": _clip(hz=440), "ref_sample_rate": 24000, "ref_text": "This is my voice."},
    ]
    codes = [_talker_codes(base, [prompt])[0][0] for prompt in prompts]
    reference = [_reference_clone_codes(ref, p) for p in prompts]
    for ours, (ref_codes, _) in zip(codes, reference):
        _assert_same_codes(ours, ref_codes)
    batch, largest = _talker_codes(base, prompts)
    assert largest == len(prompts) and all(torch.equal(a, b) for a, b in zip(batch, codes))
    assert not torch.equal(codes[0], codes[1])  # the clip's codes and transcript in the prompt change the speech

    # The audio: the reference decodes its clip's codes, then the generated ones, and cuts the clip's share;
    # the codec decodes the clip's codes with the first chunk and cuts their share (default chunks).
    with Omni(base) as omni:
        out = omni.generate(prompts[0], {"talker": GREEDY}, use_tqdm=False)[0]
    ref_codes, clip_codes = reference[0]
    assert clip_codes.shape == (19, 4)  # ceil(1.5 s * 12.5) frames of the first 4 codebooks
    ref_wavs, _ = ref.model.speech_tokenizer.decode([{"audio_codes": torch.cat([clip_codes, ref_codes])}])
    ref_audio = ref_wavs[0][clip_codes.shape[0] * 1920:]
    assert out.audio.shape == ((ref_codes.shape[0] + 1) * 1920,)  # one frame more (see _assert_same_codes)
    np.testing.assert_allclose(out.audio[:ref_audio.shape[0]], ref_audio, atol=1e-5 * np.abs(ref_audio).max())


def test_codec_matches_the_reference_decode(custom_voice):
    ref = reference_model(REFERENCE_CACHE, custom_voice)
    codes = _reference_codes(ref, {"prompt": TEXT, "voice": "vivian"})
    ref_wavs, rate = ref.model.speech_tokenizer.decode([{"audio_codes": codes}])
    from omnistage.models.qwen3_tts.modeling import load_codec_decoder

    decoder, _ = load_codec_decoder(custom_voice, torch.device("cpu"))
    with torch.inference_mode():
        ours = decoder(codes.T[None]).reshape(-1).numpy()
    assert rate == 24000 and ours.shape == ref_wavs[0].shape == (codes.shape[0] * 1920,)
    np.testing.assert_allclose(ours, ref_wavs[0], atol=1e-5 * np.abs(ref_wavs[0]).max())


def test_pipeline_audio_is_the_decoded_codes(custom_voice, omni):
    # chunk_frames=0: one pass over the whole utterance, as the authors' decode (<= 300 frames).
    out = omni.generate({"prompt": TEXT, "voice": "vivian"},
                        {"talker": GREEDY, "codec": Code2WavParams(chunk_frames=0)}, use_tqdm=False)[0]
    codes, _ = _talker_codes(custom_voice, [{"prompt": TEXT, "voice": "vivian"}])
    from omnistage.models.qwen3_tts.modeling import load_codec_decoder

    decoder, _ = load_codec_decoder(custom_voice, torch.device("cpu"))
    with torch.inference_mode():
        whole = decoder(codes[0].T[None]).reshape(-1).numpy()
    assert out.sample_rate == 24000 and out.audio.shape == (FRAMES * 1920,)
    np.testing.assert_allclose(out.audio, whole, atol=1e-5 * np.abs(whole).max())


def test_streamed_audio_matches_one_shot(omni):
    long_run = dataclasses.replace(GREEDY, max_tokens=40)
    one_shot = omni.generate(TEXT, {"talker": long_run, "codec": Code2WavParams(chunk_frames=0)}, use_tqdm=False)[0]
    peak = np.abs(one_shot.audio).max()
    # The codec carries its state from chunk to chunk: any chunking is the one-shot decode.
    for chunking in (Code2WavParams(2, 3), Code2WavParams()):
        streamed = omni.generate(TEXT, {"talker": long_run, "codec": chunking}, use_tqdm=False)[0]
        assert streamed.audio.shape == one_shot.audio.shape == (40 * 1920,)
        np.testing.assert_allclose(streamed.audio, one_shot.audio, atol=1e-5 * peak)


@pytest.mark.parametrize("prompt, problem", [
    ({"prompt": "hi", "voice": "nobody"}, "voice: unknown voice 'nobody'"),
    ({"prompt": ""}, "prompt:"),
    ({"prompt": "hi", "task_type": "VoiceDesign"}, "task_type: this checkpoint does CustomVoice"),
    ({"prompt": "hi", "language": "klingon"}, "language: unknown language"),
    ({"prompt": "hi", "language": "beijing_dialect"}, "language: unknown language"),
    ({"prompt": "hi", "instructions": "whisper"}, "instructions: the 0.6B"),
    ({"prompt": "hi", "ref_audio": np.zeros(10, np.float32)}, "ref_audio: this CustomVoice checkpoint does not clone"),
    ({"prompt": "hi", "ref_text": "words"}, "ref_text: this CustomVoice checkpoint"),
    ({"prompt": "hi", "non_streaming_mode": "yes"}, "non_streaming_mode:"),
    ({"prompt": "hi", "speed": 2}, "speed: unknown Qwen3-TTS prompt key"),
])
def test_bad_prompts_name_the_key(custom_voice, prompt, problem):
    from omnistage.models.qwen3_tts.modeling import read_config

    with pytest.raises(RequestError, match=problem):
        parse_prompt(prompt, read_config(custom_voice))


@pytest.mark.parametrize("prompt, problem", [
    ({"prompt": "hi"}, "ref_audio: a Base checkpoint clones a voice"),
    ({"prompt": "hi", "ref_text": "words"}, "ref_text: goes with ref_audio"),
    ({"prompt": "hi", "ref_audio": np.zeros((2, 10), np.float32), "ref_sample_rate": 24000}, "ref_audio: expected"),
    ({"prompt": "hi", "ref_audio": np.zeros(10, np.float32)}, "ref_sample_rate:"),
    ({"prompt": "hi", "ref_audio": np.zeros(10, np.float32), "ref_sample_rate": 24000, "instructions": "calm"},
     "instructions: a Base checkpoint"),
])
def test_bad_clone_prompts_name_the_key(base, prompt, problem):
    from omnistage.models.qwen3_tts.modeling import read_config

    with pytest.raises(RequestError, match=problem):
        parse_prompt(prompt, read_config(base))


def test_voice_design_ignores_voice_and_default_voice_is_the_first_speaker(custom_voice, voice_design):
    from omnistage.models.qwen3_tts.modeling import read_config

    design = parse_prompt({"prompt": "hi", "voice": "alloy", "instructions": "calm"}, read_config(voice_design))
    assert design.speaker is None and design.instructions == "calm"
    assert parse_prompt("hi", read_config(custom_voice)).speaker == "vivian"
    assert parse_prompt({"prompt": "hi", "voice": "dylan"}, read_config(custom_voice)).language_id is not None


def test_speech_route_speaks_with_the_checkpoint_voices(custom_voice):
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry

    from omnistage import AsyncOmni
    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    overrides = {"0": {"default_sampling_params": {"max_tokens": 8, "temperature": 0}}}
    registry = CollectorRegistry()
    engine = AsyncOmni(custom_voice, stage_overrides=overrides, metrics_registry=registry)
    app = create_app(ServerSettings(served_model_name="qwen3-tts", model_path=custom_voice), engine, registry)
    with TestClient(app) as http:
        voices = http.get("/v1/audio/voices").json()["data"]
        assert [v["name"] for v in voices] == ["vivian", "ryan", "dylan"]
        body = {"input": TEXT, "voice": "ryan", "task_type": "CustomVoice", "response_format": "pcm"}
        resp = http.post("/v1/audio/speech", json=body)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-sample-rate"] == "24000" and len(resp.content) == 2 * 8 * 1920
        assert http.post("/v1/audio/speech", json={**body, "voice": "dylan"}).status_code == 200
        sse = http.post("/v1/audio/speech", json={**body, "stream_format": "sse"})
        deltas = [line for line in sse.text.splitlines() if '"speech.audio.delta"' in line]
        assert sum(len(base64.b64decode(json.loads(d[6:])["audio"])) for d in deltas) == len(resp.content)
        for bad, param in (({"voice": "alloy"}, "voice"), ({"task_type": "Base"}, "task_type"),
                           ({"instructions": "whisper"}, "instructions")):
            resp = http.post("/v1/audio/speech", json={**body, **bad})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == param


def test_first_audio_streams_before_the_talker_ends(custom_voice):
    import asyncio
    import time

    from omnistage import AsyncOmni

    params = {"talker": dataclasses.replace(GREEDY, max_tokens=24), "codec": Code2WavParams(2, 4)}

    async def run():
        chunks, first_chunk_time = [], None
        async with AsyncOmni(custom_voice) as engine:
            async for out in engine.generate({"prompt": TEXT, "voice": "ryan"}, params):
                if out.audio_chunk is not None:
                    first_chunk_time = first_chunk_time or time.monotonic()
                    chunks.append(out.audio_chunk)
                last = out
        return chunks, first_chunk_time, last

    chunks, first_chunk_time, last = asyncio.run(run())
    assert first_chunk_time < last.metrics["stages"]["talker"]["finish_time"]
    assert len(chunks) >= 6 and len(chunks[0]) == 2 * 1920  # 2 frames, then 4 at a time
    np.testing.assert_array_equal(np.concatenate(chunks), last.audio)
    assert len(last.audio) == 24 * 1920
    assert 0 < last.metrics["time_to_first_audio"] < last.metrics["e2e_time"]


def test_speech_route_clones_an_inline_reference_clip(base):
    import io

    import soundfile as sf
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry

    from omnistage import AsyncOmni
    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    buf = io.BytesIO()
    sf.write(buf, _clip(16000), 16000, format="WAV")  # at 16 kHz: resampled to 24 kHz
    clip = "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()
    overrides = {"0": {"default_sampling_params": {"max_tokens": 6, "temperature": 0}}}
    registry = CollectorRegistry()
    engine = AsyncOmni(base, stage_overrides=overrides, metrics_registry=registry)
    app = create_app(ServerSettings(served_model_name="qwen3-tts-base", model_path=base), engine, registry)
    with TestClient(app) as http:
        body = {"input": TEXT, "voice": "alloy", "response_format": "pcm", "task_type": "Base"}
        resp = http.post("/v1/audio/speech", json={**body, "ref_audio": clip, "ref_text": "This is my voice."})
        assert resp.status_code == 200, resp.text
        assert len(resp.content) == 2 * 6 * 1920
        missing = http.post("/v1/audio/speech", json=body)  # no clip: nothing to clone
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "ref_audio"


def test_prepacked_linears_keep_the_codes_and_audio(custom_voice, omni, monkeypatch):
    """On CPU the talker's, code predictor's and codec decoder's linear layers run through oneDNN
    with prepacked weights (core/cpu_linear.py); the zoo model's are all below the size where
    that pays, so this packs every one of them: the same frames as the reference, and the
    unpacked pipeline's audio up to rounding."""
    from packed_linears import assert_every_stage_packed, pack_every_linear

    prompt, params = {"prompt": TEXT, "voice": "vivian"}, {"talker": GREEDY}
    [plain] = omni.generate(prompt, params, use_tqdm=False)
    pack_every_linear(monkeypatch)
    [codes], _ = _talker_codes(custom_voice, [prompt])
    _assert_same_codes(codes, _reference_codes(reference_model(REFERENCE_CACHE, custom_voice), prompt))
    with Omni(custom_voice) as packed:
        assert_every_stage_packed(packed)
        [out] = packed.generate(prompt, params, use_tqdm=False)
    assert out.audio.shape == plain.audio.shape
    np.testing.assert_allclose(out.audio, plain.audio, atol=1e-4 * np.abs(plain.audio).max())
