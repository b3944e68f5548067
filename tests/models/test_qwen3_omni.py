"""Qwen3-Omni end to end on the tiny zoo checkpoint: text, codec frames and waveform parity with
transformers' `Qwen3OmniMoeForConditionalGeneration.generate` (greedy), audio input, streamed
code2wav against the one-shot decode, the thinker-only variant, voices, batching, and the
chat route streaming audio; text, audio and image input.

The reference runs unmodified; its code2wav is wrapped only to record the codes `generate`
hands it. One difference is accounted for, not repaired: the reference's talker voices one
frame less than it samples when `max_new_tokens` stops it (it builds a frame's codebooks while
preparing the next step), so it is given one token more than omnistage.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnistage import Omni, OmniRequestError, SamplingParams
from omnistage.config import PipelineDeployConfig
from omnistage.models.qwen_omni.video import VideoRules
from omnistage.models.qwen3_omni import Code2WavParams, resolve_qwen3_omni
from omnistage.testing.omni_models import (
    QWEN3_OMNI_AUDIO_IN_SAMPLE_RATE,
    QWEN3_OMNI_CODE_GROUPS,
    QWEN3_OMNI_GENERATE_KWARGS,
    QWEN3_OMNI_SAMPLE_RATE,
)

from omni_reference import OmniReference, check_rope_reuse, moving_frames, tone

KW = QWEN3_OMNI_GENERATE_KWARGS
EOS = [2, 0]  # the checkpoint's generation_config eos (<|im_end|>, <|endoftext|>), which omnistage uses
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, who are you?"}]
OTHER = [{"role": "user", "content": "Tell me a story."}]
SAMPLES_PER_FRAME = 1920
NUM_FRAMES = 20
TOKENS = {"audio": "<|audio_pad|>", "image": "<|image_pad|>", "video": "<|video_pad|>", "audio_bos": "<|audio_start|>",
          "audio_eos": "<|audio_end|>"}
VIDEO_RULES = VideoRules(fps=1.0, min_pixels=128 * 32 * 32, max_pixels=768 * 32 * 32, position_id_per_seconds=13.0,
                         seconds_per_chunk=2.0)  # Qwen3OmniMoeProcessor's video defaults

pytestmark = pytest.mark.usefixtures("one_thread")


def greedy_params(frames: int = NUM_FRAMES, min_frames: int = 0, chunking: Code2WavParams | None = None) -> dict:
    return {
        "thinker": SamplingParams(temperature=0, max_tokens=KW["thinker_max_new_tokens"]),
        "talker": SamplingParams(temperature=0, max_tokens=frames, min_tokens=min_frames,
                                 repetition_penalty=KW["talker_repetition_penalty"]),
        "code2wav": chunking or Code2WavParams(chunk_frames=0),
    }


@pytest.fixture(scope="module")
def path(zoo) -> str:
    return str(zoo("qwen3-omni"))


@pytest.fixture(scope="module")
def reference(path):
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    class _RecordingCode2Wav(torch.nn.Module):
        """The reference code2wav, recording the codes generate() hands it."""

        def __init__(self, inner) -> None:
            super().__init__()
            self.inner, self.total_upsample, self.codes = inner, inner.total_upsample, []

        def chunked_decode(self, codes, **kwargs):
            self.codes.append(codes)
            return self.inner.chunked_decode(codes, **kwargs)

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).eval()
    model.code2wav = _RecordingCode2Wav(model.code2wav)
    tokenizer = AutoTokenizer.from_pretrained(path)
    features = WhisperFeatureExtractor.from_pretrained(path)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)

    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    processor = OmniReference(tokenizer, features, {"padding": True, "truncation": False},
                              _get_feat_extract_output_lengths, image_processor, Qwen3OmniMoeProcessor, TOKENS,
                              VIDEO_RULES).inputs

    def generate(messages, voice="Ethan", frames=NUM_FRAMES, use_audio_in_video=False, **overrides):
        inputs = processor(messages, use_audio_in_video)
        kwargs = {**KW, "speaker": voice, "thinker_eos_token_id": EOS, "talker_max_new_tokens": frames + 1,
                  **overrides}
        model.code2wav.codes.clear()
        with torch.inference_mode():
            out = model.generate(**inputs, **kwargs)
        if kwargs.get("return_audio") is False:
            return out[0, inputs["input_ids"].shape[1]:].tolist(), None, None
        ids, wav = out
        [codes] = model.code2wav.codes
        return ids[0, inputs["input_ids"].shape[1]:].tolist(), codes[0].T, wav.reshape(-1).numpy()

    generate.inputs, generate.path = processor, path
    return generate


@pytest.fixture(scope="module")
def omni(path):
    with Omni(path, stage_overrides={"*": {"max_num_seqs": 4}}) as omni:
        yield omni



def test_text_codes_and_waveform_match_transformers_generate(reference, omni):
    ref_ids, ref_codes, ref_wav = reference(MESSAGES)
    assert ref_codes.shape == (NUM_FRAMES, QWEN3_OMNI_CODE_GROUPS)
    # The frames the reference voices are the ones omnistage decodes: its waveform of them is ours.
    [out] = omni.generate({"messages": MESSAGES, "voice": "Ethan"}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    assert out.sample_rate == QWEN3_OMNI_SAMPLE_RATE
    assert out.audio.dtype == np.float32 and out.audio.shape == ref_wav.shape
    np.testing.assert_array_equal(out.audio, ref_wav)
    # Another voice (any case) speaks the same text differently.
    chelsie_ids, chelsie_codes, chelsie_wav = reference(MESSAGES, voice="Chelsie")
    [chelsie] = omni.generate({"messages": MESSAGES, "voice": "chelsie"}, greedy_params(), use_tqdm=False)
    assert chelsie.token_ids == chelsie_ids == ref_ids
    np.testing.assert_array_equal(chelsie.audio, chelsie_wav)
    assert not torch.equal(chelsie_codes, ref_codes)


def test_codes_match_transformers_generate(path, reference, omni):
    # The talker's frames travel to code2wav only; decoding the reference's frames with omnistage's
    # code2wav gives omnistage's waveform, which is the reference's.
    from omnistage.models.qwen3_omni.code2wav import Code2Wav

    ref_ids, ref_codes, ref_wav = reference(OTHER)
    [out] = omni.generate({"messages": OTHER}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    decoder = Code2Wav.load(path, None, torch.device("cpu"), torch.float32, max_streams=1)
    np.testing.assert_array_equal(decoder.decode([decoder.parse(ref_codes)], [decoder.open_stream()])[0], out.audio)
    np.testing.assert_array_equal(out.audio, ref_wav)


def test_audio_input_matches_transformers_generate(reference, omni):
    rate = QWEN3_OMNI_AUDIO_IN_SAMPLE_RATE
    t = np.arange(int(1.5 * rate)) / rate
    clip = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    messages = [{"role": "user", "content": [{"type": "audio", "audio": clip, "sample_rate": rate},
                                             {"type": "text", "text": "What is this sound?"}]}]
    ref_ids, _, ref_wav = reference(messages)
    [out] = omni.generate({"messages": messages}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    np.testing.assert_array_equal(out.audio, ref_wav)


def test_image_input_matches_transformers_generate(reference, omni):
    from PIL import Image

    rng = np.random.RandomState(0)
    wide = Image.fromarray((rng.rand(64, 96, 3) * 255).astype(np.uint8))  # 4 x 6 patches of 16
    square = (rng.rand(64, 64, 3) * 255).astype(np.uint8)  # a uint8 array works too
    messages = [{"role": "user", "content": [{"type": "image", "image": wide}, {"type": "text", "text": "and"},
                                             {"type": "image", "image": square},
                                             {"type": "text", "text": "Describe the image."}]}]
    ref_ids, ref_codes, ref_wav = reference(messages)
    [out] = omni.generate({"messages": messages}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    np.testing.assert_array_equal(out.audio, ref_wav)
    # The pixels matter (the talker reads the thinker's states at the image positions).
    other = [{"role": "user", "content": [{"type": "image", "image": 255 - square},
                                          {"type": "text", "text": "Describe the image."}]}]
    same = [{"role": "user", "content": [{"type": "image", "image": square}, {"type": "text", "text": "Describe the image."}]}]
    [a], [b] = (omni.generate({"messages": m}, greedy_params(), use_tqdm=False) for m in (other, same))
    np.testing.assert_array_equal(a.audio, reference(other)[2])
    assert not np.array_equal(a.audio, b.audio)
    # An image and audio in one batch with a text-only request: each as alone.
    text_only = omni.generate({"messages": OTHER}, greedy_params(), use_tqdm=False)[0]
    together = omni.generate([{"messages": messages}, {"messages": OTHER}], greedy_params(), use_tqdm=False)
    assert together[0].token_ids == ref_ids and together[1].token_ids == text_only.token_ids
    np.testing.assert_allclose(together[0].audio, ref_wav, rtol=0, atol=1e-5)


def test_audio_streams_and_chunks_equal_the_one_shot_decode(omni):
    num_frames = 64  # chunks at 5, 30, 55 frames; the rest at the end
    chunking = Code2WavParams(first_chunk_frames=5, chunk_frames=25)
    params = greedy_params(num_frames, num_frames, chunking)

    async def collect():
        chunks, last = [], None
        async for out in omni.async_omni.generate({"messages": MESSAGES}, params):
            if out.audio_chunk is not None:
                chunks.append((time.monotonic(), out.audio_chunk))
            last = out
        return chunks, last

    chunks, last = asyncio.run(collect())
    assert last.error is None and len(chunks) == 4
    np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), last.audio)
    assert chunks[0][0] < last.metrics["stages"]["talker"]["finish_time"]
    assert last.metrics["time_to_first_audio"] < last.metrics["e2e_time"]
    [whole] = omni.generate({"messages": MESSAGES}, greedy_params(num_frames, num_frames), use_tqdm=False)
    assert whole.token_ids == last.token_ids
    # Chunks join without a gap, and code2wav's carried state makes them the one-shot decode.
    assert last.audio.shape == whole.audio.shape
    assert len(whole.audio) > (num_frames - 1) * SAMPLES_PER_FRAME
    np.testing.assert_allclose(last.audio, whole.audio, rtol=0, atol=1e-5 * np.abs(whole.audio).max())


def test_two_requests_at_once_match_each_alone(omni):
    prompts = [{"messages": MESSAGES}, {"messages": OTHER, "voice": "Chelsie"}]
    params = greedy_params(24, 24, Code2WavParams())
    alone = [omni.generate(p, params, use_tqdm=False)[0] for p in prompts]
    together = omni.generate(prompts, params, use_tqdm=False)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.audio, b.audio, rtol=0, atol=1e-5)
    assert together[0].token_ids != together[1].token_ids


def test_prefix_cache_hits_keep_text_codes_and_waveform(reference, omni):
    # As Qwen2.5-Omni's: the thinker reuses cached blocks of an earlier request with the same system
    # prompt, and of the same request repeated, and hands the talker the rows of every prompt position
    # (stored with the blocks): text, the number of frames and the waveform made of them stay the
    # uncached reference's.
    system = {"role": "system", "content": "You are a prefix-cache test. Answer in one short line, please."}
    first = [system, {"role": "user", "content": "Hello, who are you?"}]
    second = [system, {"role": "user", "content": "Tell me a story."}]
    refs = {id(m): reference(m) for m in (first, second)}
    cached, talker_cached = [], []
    for messages in (first, second, first):
        [out] = omni.generate({"messages": messages, "voice": "Ethan"}, greedy_params(), use_tqdm=False)
        stages = out.metrics["stages"]
        cached.append(stages["thinker"]["num_cached_tokens"])
        talker_cached.append(stages["talker"]["num_cached_tokens"])
        ref_ids, ref_codes, ref_wav = refs[id(messages)]
        assert out.token_ids == ref_ids
        assert stages["talker"]["num_generated_tokens"] == ref_codes.shape[0]
        np.testing.assert_array_equal(out.audio, ref_wav)
    assert cached == [0, 32, 48]  # blocks of 16: the system prompt's, then up to the last prompt token
    # The talker's prompt (the user turn and the assistant's start; no system turn) is keyed by its
    # rows' digests: the same request again hits its first block (other tests may have warmed the rest).
    assert talker_cached[2] == 16


def test_image_prompt_hits_keep_text_codes_and_waveform(reference, omni):
    # An image prompt repeated reuses the blocks over its image; one that adds a second image hits
    # only the first block, which ends inside the first image: the prefill merges the encoder's and
    # deepstack's rows of the positions it feeds only. Text, frames and waveform stay the reference's.
    rng = np.random.RandomState(2)
    a, b = ((rng.rand(128, 128, 3) * 255).astype(np.uint8) for _ in range(2))  # 16 tokens each

    def prompt(*images):
        parts = [{"type": "image", "image": image} for image in images]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe the image."}]}]

    cached, talker_cached = [], []
    for messages in (prompt(a), prompt(a), prompt(a, b)):
        [out] = omni.generate({"messages": messages, "voice": "Ethan"}, greedy_params(), use_tqdm=False)
        stages = out.metrics["stages"]
        cached.append(stages["thinker"]["num_cached_tokens"])
        talker_cached.append(stages["talker"]["num_cached_tokens"])
        ref_ids, ref_codes, ref_wav = reference(messages)
        assert out.token_ids == ref_ids
        assert stages["talker"]["num_generated_tokens"] == ref_codes.shape[0]
        np.testing.assert_array_equal(out.audio, ref_wav)
    assert cached == [0, 32, 16]
    assert talker_cached == [0, 32, 16]  # the talker's rows of the image positions come from those blocks


def test_clip_padded_to_a_longer_one_reuses_no_blocks_of_it_alone(path, reference):
    # The processor pads a request's clips to the longest, which changes a shorter clip's last
    # frames: the blocks over a clip alone are not its blocks beside a longer clip (a hit there would
    # hand on rows that a cold prefill does not make). Past its last frame's window more padding
    # changes nothing, so beside a longer clip still it hits again. The features stay the processor's.
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.core.types import StageRequest
    from omnistage.models.qwen3_omni import THINKER_STAGE
    from omnistage.models.qwen3_omni.processors import thinker_inputs

    short = tone(2.0, 440.0)  # 26 tokens, at 4..30: its blocks are the first two

    def prompt(*clips):
        parts = [{"type": "audio", "audio": clip, "sample_rate": 16000} for clip in clips]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this sound?"}]}]

    engine = AREngine(path, THINKER_STAGE, StageDeployConfig(devices=("cpu",), dtype="float32", max_num_seqs=2))
    params = SamplingParams(temperature=0, max_tokens=2)

    def run(messages) -> tuple[int, torch.Tensor]:
        """(cached tokens, the hidden states handed on), with the features checked against the processor's."""
        request = SimpleNamespace(prompt={"messages": messages, "voice": "Ethan"}, output_modalities=None)
        rid = f"r{engine.block_manager.num_prefix_queries}"
        engine.add_request(StageRequest(rid, thinker_inputs(request, {}), params))
        features, mask = engine._seqs[rid].model_state.media.audio_inputs
        ref = reference.inputs(messages, False)
        ref_mask = ref["feature_attention_mask"].bool()
        assert torch.equal(mask.sum(-1), ref_mask.sum(-1))
        for i in range(len(mask)):
            assert torch.equal(features[i][:, mask[i].bool()], ref["input_features"][i][:, ref_mask[i]])
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        return outs[-1].metrics["num_cached_tokens"], outs[-1].payload.hidden_states

    prompts = [prompt(short), prompt(short, tone(2.999, 550.0)), prompt(short, tone(4.0, 660.0))]
    warm = [run(m) for m in prompts]
    for messages, (_, hidden) in zip(prompts[1:], warm[1:]):
        engine.block_manager.reset_prefix_cache()
        cached, cold = run(messages)
        assert cached == 0 and torch.equal(hidden, cold)
    assert [cached for cached, _ in warm] == [0, 0, 32]
    engine.close()


def test_thinker_only_variant(path, reference, tmp_path):
    deploy = tmp_path / "text.yaml"
    deploy.write_text("base_config: bundled:qwen3_omni.yaml\noutput_modalities: [text]\n")
    ref_ids, _, _ = reference(MESSAGES, return_audio=False)
    with Omni(path, deploy_config=deploy) as text_only:
        assert [s.name for s in text_only.spec.stages] == ["thinker"]
        [out] = text_only.generate({"messages": MESSAGES, "voice": "Ethan"}, {"thinker": greedy_params()["thinker"]},
                                   use_tqdm=False)
    assert out.token_ids == ref_ids and out.audio is None
    no_audio = SimpleNamespace(config={"enable_audio_output": False})
    assert resolve_qwen3_omni(no_audio, PipelineDeployConfig()).name == "qwen3_omni_thinker_only"


def test_text_only_request_runs_the_thinker_alone(reference, omni):
    ref_ids, _, _ = reference(MESSAGES, return_audio=False)
    [out] = omni.generate({"messages": MESSAGES}, greedy_params(), modalities=["text"], use_tqdm=False)
    assert out.error is None and out.token_ids == ref_ids and out.audio is None
    assert set(out.metrics["stages"]) == {"thinker"}


def test_video_input_matches_transformers_generate(reference, omni):
    frames = moving_frames(8)  # 2 s at 4 fps: 4 frames (the minimum) sampled at 1 fps, 2 temporal groups
    messages = [{"role": "user", "content": [{"type": "video", "video": frames, "fps": 4.0},
                                             {"type": "text", "text": "What happens?"}]}]
    ref_ids, ref_codes, ref_wav = reference(messages)
    [out] = omni.generate({"messages": messages, "voice": "Ethan"}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    np.testing.assert_array_equal(out.audio, ref_wav)


def test_video_with_its_audio_matches_transformers_generate(reference, omni):
    # 4 s at 1 fps: 2 temporal groups at 0 and 26 position ids, merged by time with the clip's audio
    # tokens; after a separate audio part and an image, so audio, image and video all meet. Text only:
    # the reference's talker fails on such a prompt (its get_rope_index reads a talker_config.audio_config
    # that does not exist), so omnistage refuses audio output for it by name.
    image = moving_frames(1, seed=3, height=64, width=64)[0]
    messages = [{"role": "user", "content": [
        {"type": "audio", "audio": tone(1.0, 330.0), "sample_rate": 16000},
        {"type": "image", "image": image},
        {"type": "video", "video": moving_frames(16, seed=1), "fps": 4.0, "audio_track": tone(4.0), "sample_rate": 16000},
        {"type": "text", "text": "What do you see and hear?"}]}]
    ref_ids, _, _ = reference(messages, use_audio_in_video=True, return_audio=False)
    prompt = {"messages": messages, "use_audio_in_video": True}
    [out] = omni.generate(prompt, greedy_params(), modalities=["text"], use_tqdm=False)
    assert out.token_ids == ref_ids
    # The tiny thinker's greedy text barely moves with its input, so check the prompt itself: the
    # thinker lays it out (ids) and places it (M-RoPE positions) as the reference does.
    from omnistage.models.qwen3_omni.thinker import Qwen3OmniThinker

    thinker = Qwen3OmniThinker.load(reference.path, None, torch.device("cpu"), torch.float32)
    ours = thinker.build_prompt(prompt)
    inputs = reference.inputs(messages, use_audio_in_video=True)
    assert ours.token_ids == inputs["input_ids"][0].tolist()
    positions, _ = thinker.model.get_rope_index(inputs["input_ids"], inputs["image_grid_thw"], inputs["video_grid_thw"],
                                                inputs["attention_mask"], True,
                                                inputs["feature_attention_mask"].sum(-1), inputs["video_second_per_grid"])
    torch.testing.assert_close(ours.model_state.mrope_positions, positions[:, 0], rtol=0, atol=0)
    video = inputs["input_ids"][0] == thinker.video_token_id
    assert not video[torch.nonzero(video)[0]:torch.nonzero(video)[-1]].all()  # audio tokens between frame groups
    with pytest.raises(OmniRequestError, match="use_audio_in_video works with text output only on Qwen3-Omni"):
        omni.generate({**prompt, "voice": "Ethan"}, greedy_params(), use_tqdm=False)


def test_talker_follows_the_streaming_thinker(omni, path):
    # The talker starts from the thinker's streamed rows (after its second token) and makes frames
    # while the thinker is still writing; its frames equal the whole hand-off's.
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.core.types import InputChunk, StageRequest
    from omnistage.models.qwen3_omni import TALKER_STAGE, THINKER_STAGE
    from omnistage.models.qwen3_omni.processors import THINKER, talker_inputs, thinker_chunks, thinker_inputs

    thinker_params = SamplingParams(temperature=0, max_tokens=24, min_tokens=24)
    talker_params = greedy_params(frames=30, min_frames=30)["talker"]
    prompt = {"messages": MESSAGES, "voice": "Ethan"}
    [out] = omni.generate(prompt, {**greedy_params(frames=30, min_frames=30), "thinker": thinker_params},
                          use_tqdm=False)
    stages = out.metrics["stages"]
    assert out.error is None and len(out.token_ids) == 24
    assert stages["talker"]["first_output_time"] < stages["thinker"]["finish_time"]

    # The same hand-off, engine by engine, as the orchestrator does it.
    config = StageDeployConfig(devices=("cpu",), dtype="float32", max_num_seqs=2)
    request = SimpleNamespace(prompt=prompt, output_modalities=None)
    thinker, talker = AREngine(path, THINKER_STAGE, config), AREngine(path, TALKER_STAGE, config)
    thinker.add_request(StageRequest("t", thinker_inputs(request, {}), thinker_params))
    started, frames_while_thinking, last_thinker, streamed = False, 0, None, None
    while thinker.has_unfinished_requests() or talker.has_unfinished_requests():
        for o in thinker.step():
            last_thinker = o
            chunk = thinker_chunks(request, o.payload, o.finished)
            talker.add_request(StageRequest("s", chunk if not started else InputChunk(chunk), talker_params))
            started = True
        for o in talker.step() + talker.step():  # two talker steps per thinker step: it must wait for rows
            frames_while_thinking += not last_thinker.finished
            streamed = o.payload.extras["audio_codes"].clone()
    assert frames_while_thinking > 10 and last_thinker.payload.token_ids == out.token_ids
    talker.add_request(StageRequest("w", talker_inputs(request, {THINKER: last_thinker.payload}), talker_params))
    while talker.has_unfinished_requests():
        whole = talker.step()[-1].payload.extras["audio_codes"]
    assert whole.shape == (30, QWEN3_OMNI_CODE_GROUPS)
    torch.testing.assert_close(streamed, whole, rtol=0, atol=0)
    assert talker.block_manager.num_free_blocks == talker.block_manager.num_blocks
    thinker.close()
    talker.close()


def test_bad_voice_fails_naming_the_thinker(omni):
    with pytest.raises(OmniRequestError, match=r"thinker.*unknown voice 'Nobody'"):
        omni.generate({"messages": MESSAGES, "voice": "Nobody"}, greedy_params(), use_tqdm=False)



def test_chat_completions_route_streams_audio_for_an_image(path):
    import base64
    import json

    from fastapi.testclient import TestClient

    from omnistage import AsyncOmni
    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    # The route sets the thinker's params only; the talker samples with its deploy defaults, capped here,
    # seeded and held to a floor of frames (unseeded, a random talker can end at once with no audio).
    engine = AsyncOmni(path, stage_overrides={"1": {"default_sampling_params": {"max_tokens": 30, "min_tokens": 12,
                                                                                "seed": 0}}})
    app = create_app(ServerSettings(served_model_name="omni", model_path=path), engine)
    from PIL import Image

    from omnistage.media.image import image_to_data_url

    image = Image.fromarray((np.random.RandomState(0).rand(64, 64, 3) * 255).astype(np.uint8))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_to_data_url(image)}},
                                             {"type": "text", "text": "Describe the image."}]}]
    body = {"messages": messages, "modalities": ["text", "audio"], "max_tokens": 8, "temperature": 0,
            "stream": True, "audio": {"voice": "Chelsie", "format": "pcm16"}}
    with TestClient(app) as http, http.stream("POST", "/v1/chat/completions", json=body) as streamed:
        assert streamed.status_code == 200
        lines = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"].get("audio") for c in lines if c["choices"]]
    pcm = [base64.b64decode(d["data"]) for d in deltas if d and d.get("data")]
    assert len(pcm) >= 2 and all(len(p) % 2 == 0 for p in pcm)  # streamed in more than one piece
    assert "".join(d.get("transcript", "") for d in deltas if d)


@pytest.mark.parametrize("num_frames", [0, 3, 5, 30, 57])
@pytest.mark.parametrize("chunking", [Code2WavParams(), Code2WavParams(first_chunk_frames=1, chunk_frames=1),
                                      Code2WavParams(chunk_frames=0)])
def test_talker_chunks_cover_the_utterance_once(num_frames, chunking):
    from omnistage.core.types import TextPayload
    from omnistage.models.qwen3_omni.processors import CODE2WAV, talker_chunks

    request = SimpleNamespace(request_id="r", params={CODE2WAV: chunking})
    codes = torch.arange(num_frames * 4).reshape(num_frames, 4)
    parts = []
    # One frame per step, then the EOS step (no new frame).
    steps = [(n, 1, False) for n in range(1, num_frames + 1)] + [(num_frames, 0, True)]
    for n, num_new, done in steps:
        payload = TextPayload(token_ids=[0] * n, extras={"audio_codes": codes[:n], "num_new_frames": num_new})
        part = talker_chunks(request, payload, done)
        if part is not None:
            parts.append(part)
    assert torch.equal(torch.cat([p["codes"] for p in parts]), codes)
    assert [p["is_last"] for p in parts] == [False] * (len(parts) - 1) + [True]
    if chunking.chunk_frames == 0:
        assert len(parts) == 1


def test_a_thinker_that_stops_at_once_still_speaks(omni):
    # The reference generate() fails when the thinker's first token ends its answer; here the talker
    # speaks the end of text (its prompt still ends in the codec BOS).
    params = greedy_params(8, 8)
    params["thinker"] = SamplingParams(temperature=0, max_tokens=1)
    [out] = omni.generate({"messages": MESSAGES}, params, use_tqdm=False)
    assert out.error is None and len(out.token_ids) == 1
    assert out.audio.shape[0] > 7 * SAMPLES_PER_FRAME


def test_prepacked_linears_keep_the_reply(reference, path, monkeypatch):
    """On CPU every stage's linear layers (thinker, talker with its code predictor, code2wav)
    run through oneDNN with prepacked weights (core/cpu_linear.py); the zoo model's are all
    below the size where that pays, so this packs every one of them: the same text as
    transformers, and its waveform up to rounding."""
    from packed_linears import assert_every_stage_packed, pack_every_linear

    pack_every_linear(monkeypatch)
    ref_ids, ref_codes, ref_wav = reference(MESSAGES)
    with Omni(path) as packed:
        assert_every_stage_packed(packed)
        [out] = packed.generate({"messages": MESSAGES, "voice": "Ethan"}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    assert out.audio.shape == ref_wav.shape
    np.testing.assert_allclose(out.audio, ref_wav, rtol=0, atol=1e-4 * np.abs(ref_wav).max())


def test_mrope_positions_reuse_a_shared_start(omni):
    check_rope_reuse(omni.async_omni.orchestrator.handles[0].endpoint.server.engine.model)
