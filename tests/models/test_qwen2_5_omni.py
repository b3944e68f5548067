"""Qwen2.5-Omni end to end on the tiny zoo checkpoint: text and waveform parity with
transformers' `generate` (greedy), streamed audio before the talker ends, the thinker-only
variant, voices, and two requests at once.

The reference is `Qwen2_5OmniForConditionalGeneration.generate` with one repair: transformers
5 drops an all-ones attention mask in `generate()`, and the talker's forward adds the codec
pad/bos embeddings to its prompt (and computes its M-RoPE positions) only when it gets a
mask. `_MaskedTalker` hands the mask back, so the reference runs the talker as designed
(and as transformers 4 ran it); omnistage always does. Repair 2: with an image or a video, `generate()` passes
`pixel_values` / `pixel_values_videos` on to the talker's `generate`, which refuses them as unused model
kwargs; `_MaskedTalker` accepts and drops them (the talker reads only the grids). Everything else is the reference's.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, Omni, OmniRequestError, SamplingParams
from omnistage.config import PipelineDeployConfig
from omnistage.models.qwen2_5_omni import Token2WavParams, resolve_qwen2_5_omni
from omnistage.models.qwen_omni.video import VideoRules, sample_frame_indices, video_pixels
from omnistage.testing.speech_models import DEFAULT_GENERATE_KWARGS, OMNI_SAMPLE_RATE

from omni_reference import OmniReference, check_rope_reuse, moving_frames, tone

KW = DEFAULT_GENERATE_KWARGS["qwen2.5-omni"]
EOS = [2, 0]  # the checkpoint's generation_config eos (<|im_end|>, <|endoftext|>), which omnistage uses
MESSAGES = [{"role": "user", "content": "Hello, who are you?"}]
OTHER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
SEED = 1234
TOKENS = {"audio": "<|AUDIO|>", "image": "<|IMAGE|>", "video": "<|VIDEO|>", "audio_bos": "<|audio_bos|>",
          "audio_eos": "<|audio_eos|>"}
VIDEO_RULES = VideoRules(fps=2.0, min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28, position_id_per_seconds=25,
                         seconds_per_chunk=2.0)  # Qwen2_5OmniProcessor's video defaults

# Tiny models are bound by per-op overhead; one intra-op thread avoids spinning on a shared machine.
pytestmark = pytest.mark.usefixtures("one_thread")


def greedy_params(chunk_size: int = 0, talker_tokens: int = KW["talker_max_new_tokens"], min_codes: int = 0,
                  seed: int = SEED) -> dict:
    return {
        "thinker": SamplingParams(temperature=0, max_tokens=KW["thinker_max_new_tokens"]),
        "talker": SamplingParams(temperature=0, max_tokens=talker_tokens, min_tokens=min_codes,
                                 repetition_penalty=KW["talker_repetition_penalty"]),
        "token2wav": Token2WavParams(seed=seed, num_steps=KW["token2wav_num_steps"], chunk_size=chunk_size),
    }


@pytest.fixture(scope="module")
def path(zoo) -> str:
    return str(zoo("qwen2.5-omni"))


@pytest.fixture(scope="module")
def reference(path):
    from transformers import (
        AutoTokenizer,
        Qwen2_5OmniForConditionalGeneration,
        Qwen2_5OmniTalkerForConditionalGeneration,
        WhisperFeatureExtractor,
    )
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class _MaskedTalker(Qwen2_5OmniTalkerForConditionalGeneration):
        _keys_to_ignore_on_load_unexpected = [r"^thinker\.", r"^token2wav\."]

        # The parent's named arguments, spelled out: generate() checks its kwargs against them.
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                    thinker_reply_part=None, inputs_embeds=None, use_cache=None, input_text_ids=None,
                    image_grid_thw=None, video_grid_thw=None, use_audio_in_video=None, audio_feature_lengths=None,
                    video_second_per_grid=None, pixel_values=None, pixel_values_videos=None, **kwargs):
            # generate() hands the talker every shared kwarg, pixels included, which the talker does not
            # take (transformers 5 then refuses them as unused): accept and drop them (repair 2).
            if attention_mask is None:
                new = inputs_embeds if inputs_embeds is not None else input_ids
                past = cache.get_seq_length() if cache is not None else 0
                attention_mask = torch.ones(new.shape[0], past + new.shape[1], dtype=torch.long)
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                thinker_reply_part=thinker_reply_part, inputs_embeds=inputs_embeds, use_cache=use_cache,
                input_text_ids=input_text_ids, image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
                use_audio_in_video=use_audio_in_video, audio_feature_lengths=audio_feature_lengths,
                video_second_per_grid=video_second_per_grid, **kwargs)

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(path).eval()
    model.talker = _MaskedTalker.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    features = WhisperFeatureExtractor.from_pretrained(path)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)

    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor

    processor = OmniReference(tokenizer, features, {"padding": "max_length"}, _get_feat_extract_output_lengths,
                              image_processor, Qwen2_5OmniProcessor, TOKENS, VIDEO_RULES).inputs

    def generate(messages, voice="Chelsie", use_audio_in_video=False, **overrides):
        inputs = processor(messages, use_audio_in_video)
        kwargs = {**KW, "speaker": voice, "thinker_eos_token_id": EOS, **overrides}
        torch.manual_seed(SEED)  # token2wav's noise; greedy thinker and talker draw nothing
        with torch.inference_mode():
            out = model.generate(**inputs, **kwargs)
        if kwargs.get("generation_mode") == "text":
            return out[0, inputs["input_ids"].shape[1]:].tolist(), None
        ids, wav = out
        return ids[0, inputs["input_ids"].shape[1]:].tolist(), wav.numpy()

    return generate


@pytest.fixture(scope="module")
def omni(path):
    # Batches of up to 4 in every stage (the CPU deploy default is 1), so concurrent requests share forwards.
    with Omni(path, stage_overrides={"*": {"max_num_seqs": 4}}) as omni:
        yield omni


def test_text_and_waveform_match_transformers_generate(reference, omni):
    ref_ids, ref_wav = reference(MESSAGES)
    [out] = omni.generate({"messages": MESSAGES}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    assert out.sample_rate == OMNI_SAMPLE_RATE
    assert out.audio.dtype == np.float32 and out.audio.shape == ref_wav.shape
    np.testing.assert_array_equal(out.audio, ref_wav)
    # Another voice speaks the same text differently.
    ethan_ids, ethan_wav = reference(MESSAGES, voice="Ethan")
    [ethan] = omni.generate({"messages": MESSAGES, "voice": "Ethan"}, greedy_params(), use_tqdm=False)
    assert ethan.token_ids == ethan_ids == ref_ids
    np.testing.assert_array_equal(ethan.audio, ethan_wav)
    assert not np.array_equal(ethan.audio, out.audio)


def test_audio_input_matches_transformers_generate(reference, omni):
    rate = 16000
    t = np.arange(int(1.5 * rate)) / rate
    clip = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    messages = [{"role": "user", "content": [{"type": "audio", "audio": clip, "sample_rate": rate},
                                             {"type": "text", "text": "What is this sound?"}]}]
    ref_ids, ref_wav = reference(messages)
    [out] = omni.generate({"messages": messages}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    np.testing.assert_array_equal(out.audio, ref_wav)


def test_image_input_matches_transformers_generate(reference, omni):
    from PIL import Image

    rng = np.random.RandomState(0)
    wide = Image.fromarray((rng.rand(60, 90, 3) * 255).astype(np.uint8))  # resized to 56 x 84: 4 x 6 patches
    square = (rng.rand(56, 56, 3) * 255).astype(np.uint8)  # a uint8 array works too
    messages = [{"role": "user", "content": [{"type": "image", "image": wide}, {"type": "text", "text": "and"},
                                             {"type": "image", "image": square},
                                             {"type": "text", "text": "Describe the image."}]}]
    ref_ids, ref_wav = reference(messages)
    [out] = omni.generate({"messages": messages}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    np.testing.assert_array_equal(out.audio, ref_wav)
    # The pixels matter: the talker reads the thinker's states at the image positions, so another
    # image is spoken differently (the tiny thinker's greedy text barely moves).
    other = [{"role": "user", "content": [{"type": "image", "image": 255 - square},
                                          {"type": "text", "text": "Describe the image."}]}]
    same = [{"role": "user", "content": [{"type": "image", "image": square}, {"type": "text", "text": "Describe the image."}]}]
    [a], [b] = (omni.generate({"messages": m}, greedy_params(), use_tqdm=False) for m in (other, same))
    np.testing.assert_array_equal(a.audio, reference(other)[1])
    assert not np.array_equal(a.audio, b.audio)


def test_video_pixels_stack_consecutive_frames_as_the_video_processor_does(path):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil.from_pretrained(path)
    frame = moving_frames(1)[0]
    rules = VideoRules(fps=2.0, min_pixels=3136, max_pixels=12845056, position_id_per_seconds=25, seconds_per_chunk=2)
    # Two equal frames are one still image (the image path repeats a frame over the temporal patch).
    still, grid = video_pixels(processor, np.stack([frame, frame]), rules)
    image = processor(images=[frame], return_tensors="np")
    assert grid == [1, *image["image_grid_thw"][0][1:].tolist()]
    np.testing.assert_array_equal(still, image["pixel_values"])
    # Three frames: two temporal groups, the last frame repeated to fill the second.
    frames = moving_frames(3)
    pixels, grid = video_pixels(processor, frames, rules)
    assert grid[0] == 2
    patches = pixels.reshape(2, grid[1] * grid[2], 3, 2, 14 * 14)
    last, _ = video_pixels(processor, np.stack([frames[2], frames[2]]), rules)
    np.testing.assert_array_equal(patches[1].reshape(last.shape), last)
    assert not np.array_equal(patches[0, :, :, 0], patches[0, :, :, 1])  # group 0 holds frames 0 and 1


def test_frame_sampling_follows_the_video_processor():
    assert sample_frame_indices(16, 4.0, 2.0, 2, 4, 768) == [0, 2, 4, 6, 8, 10, 12, 14]  # 4 s at 2 fps
    assert sample_frame_indices(6, 4.0, 2.0, 2, 4, 768) == [0, 1, 3, 4]  # at least min_frames
    assert sample_frame_indices(5, 30.0, 2.0, 2, 4, 768) == [0, 1, 2, 3]  # rounded to whole temporal patches
    with pytest.raises(ValueError, match="at least 2 frames"):
        sample_frame_indices(1, 30.0, 2.0, 2, 4, 768)


def test_video_input_matches_transformers_generate(reference, omni):
    frames = moving_frames(8)  # 2 s at 4 fps: 4 frames sampled at 2 fps, 2 temporal groups
    messages = [{"role": "user", "content": [{"type": "video", "video": frames, "fps": 4.0},
                                             {"type": "text", "text": "What happens?"}]}]
    ref_ids, ref_wav = reference(messages)
    [out] = omni.generate({"messages": messages}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    np.testing.assert_array_equal(out.audio, ref_wav)
    # An encoded video (MP4 bytes) is sampled the same way: it equals its decoded frames.
    from omnistage.media.video import decode_video, encode_mp4

    mp4 = encode_mp4(frames, 4.0)
    decoded, _ = decode_video(mp4)
    as_bytes = [{"role": "user", "content": [{"type": "video", "video": mp4}, {"type": "text", "text": "What happens?"}]}]
    as_frames = [{"role": "user", "content": [{"type": "video", "video": decoded, "fps": 4.0},
                                              {"type": "text", "text": "What happens?"}]}]
    [a], [b] = (omni.generate({"messages": m}, greedy_params(), use_tqdm=False) for m in (as_bytes, as_frames))
    assert a.token_ids == b.token_ids
    np.testing.assert_array_equal(a.audio, b.audio)


def test_video_with_its_audio_matches_transformers_generate(reference, omni):
    # 4 s: 8 sampled frames in 4 temporal groups and 100 audio tokens, interleaved in two 2-second chunks,
    # after a separate audio part (so the video's own audio is the second clip heard).
    messages = [{"role": "user", "content": [
        {"type": "audio", "audio": tone(1.0, 330.0), "sample_rate": 16000},
        {"type": "video", "video": moving_frames(16, seed=1), "fps": 4.0, "audio_track": tone(4.0), "sample_rate": 16000},
        {"type": "text", "text": "What do you see and hear?"}]}]
    ref_ids, ref_wav = reference(messages, use_audio_in_video=True)
    [out] = omni.generate({"messages": messages, "use_audio_in_video": True}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    np.testing.assert_array_equal(out.audio, ref_wav)
    # Without its audio the same video is another prompt.
    [silent] = omni.generate({"messages": messages}, greedy_params(), use_tqdm=False)
    assert not np.array_equal(silent.audio, out.audio)


def test_video_and_image_part_errors_name_the_problem(omni):
    cases = [({"type": "video", "video": moving_frames(4)}, "needs its 'fps'"),
             ({"type": "image", "image": np.zeros((28, 28), np.float32)}, r"uint8 \[H, W, 3\] array, got float32"),
             ({"type": "video", "video": moving_frames(1), "fps": 2.0}, "at least 2 frames"),
             ({"type": "video", "video": np.zeros((4, 8, 8), np.uint8), "fps": 2.0}, r"uint8 \[F, H, W, 3\]")]
    for part, message in cases:
        with pytest.raises(OmniRequestError, match=message):
            omni.generate({"messages": [{"role": "user", "content": [part]}]}, greedy_params(), use_tqdm=False)
    heard = {"messages": [{"role": "user", "content": [{"type": "video", "video": moving_frames(4), "fps": 2.0}]}],
             "use_audio_in_video": True}
    with pytest.raises(OmniRequestError, match="use_audio_in_video is set but the video part has no audio"):
        omni.generate(heard, greedy_params(), use_tqdm=False)


def test_audio_streams_before_the_talker_finishes(omni):
    # The default chunking: a first chunk of 12 frames sent at 24 codes (12 of look-ahead), then
    # 36-frame chunks: [12, 48) sent at 60 codes, the rest [48, 96) when the talker ends.
    num_codes = 96
    params = greedy_params(chunk_size=36, talker_tokens=num_codes, min_codes=num_codes)

    async def collect():
        chunks, text, last = [], "", None
        async for out in omni.async_omni.generate({"messages": MESSAGES}, params):
            if out.audio_chunk is not None:
                chunks.append((time.monotonic(), out.audio_chunk))
            text += out.text_delta or ""
            last = out
        return chunks, text, last

    chunks, text, last = asyncio.run(collect())
    assert text == last.text
    assert last.error is None and last.audio.shape == (num_codes * 480,)
    assert [len(c) for _, c in chunks] == [12 * 480, 36 * 480, 48 * 480]
    np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), last.audio)
    talker = last.metrics["stages"]["talker"]
    assert chunks[0][0] < talker["finish_time"]
    assert last.metrics["time_to_first_audio"] < last.metrics["e2e_time"]
    # Chunked decode approximates the one-shot one (the DiT attends across chunk borders).
    [whole] = omni.generate({"messages": MESSAGES}, greedy_params(0, num_codes, num_codes), use_tqdm=False)
    assert whole.token_ids == last.token_ids
    err = np.linalg.norm(last.audio - whole.audio) / np.linalg.norm(whole.audio)
    assert err < 1e-3, err


def test_talker_follows_the_streaming_thinker(omni, path):
    # The talker starts from the thinker's streamed rows (after its second token) and emits
    # codes while the thinker is still writing; its codes equal the whole hand-off's.
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.core.types import InputChunk, StageRequest
    from omnistage.models.qwen2_5_omni import TALKER_STAGE, THINKER_STAGE
    from omnistage.models.qwen2_5_omni.processors import THINKER, talker_inputs, thinker_chunks, thinker_inputs

    thinker_params = SamplingParams(temperature=0, max_tokens=24, min_tokens=24)
    talker_params = greedy_params(talker_tokens=40)["talker"]
    [out] = omni.generate({"messages": MESSAGES}, {**greedy_params(talker_tokens=40), "thinker": thinker_params},
                          use_tqdm=False)
    stages = out.metrics["stages"]
    assert out.error is None and len(out.token_ids) == 24
    assert stages["talker"]["first_output_time"] < stages["thinker"]["finish_time"]

    # The same hand-off, engine by engine, as the orchestrator does it.
    config = StageDeployConfig(devices=("cpu",), dtype="float32", max_num_seqs=2)
    request = SimpleNamespace(prompt={"messages": MESSAGES}, output_modalities=None)
    thinker, talker = AREngine(path, THINKER_STAGE, config), AREngine(path, TALKER_STAGE, config)
    thinker.add_request(StageRequest("t", thinker_inputs(request, {}), thinker_params))
    started, codes_while_thinking, last_thinker, streamed = False, 0, None, None
    while thinker.has_unfinished_requests() or talker.has_unfinished_requests():
        for o in thinker.step():
            last_thinker = o
            chunk = thinker_chunks(request, o.payload, o.finished)
            talker.add_request(StageRequest("s", chunk if not started else InputChunk(chunk), talker_params))
            started = True
        for o in talker.step() + talker.step():  # two talker steps per thinker step: it must wait for rows
            codes_while_thinking += not last_thinker.finished
            streamed = o.payload.token_ids
    assert codes_while_thinking > 10 and last_thinker.payload.token_ids == out.token_ids
    talker.add_request(StageRequest("w", talker_inputs(request, {THINKER: last_thinker.payload}), talker_params))
    while talker.has_unfinished_requests():
        whole = talker.step()[-1].payload.token_ids
    assert streamed == whole and len(whole) == 40
    assert talker.block_manager.num_free_blocks == talker.block_manager.num_blocks
    thinker.close()
    talker.close()


def test_two_requests_at_once_match_each_alone(omni):
    # Batched together, with different prompt lengths (padding) and voices.
    prompts = [{"messages": MESSAGES}, {"messages": OTHER, "voice": "Ethan"}]
    params = greedy_params(chunk_size=36, talker_tokens=64, min_codes=64)
    alone = [omni.generate(p, params, use_tqdm=False)[0] for p in prompts]
    together = omni.generate(prompts, params, use_tqdm=False)
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        np.testing.assert_array_equal(a.audio, b.audio)
    assert together[0].token_ids != together[1].token_ids


def test_thinker_only_variant(path, reference, tmp_path):
    deploy = tmp_path / "text.yaml"
    deploy.write_text("base_config: bundled:qwen2_5_omni.yaml\noutput_modalities: [text]\n")
    ref_ids, _ = reference(MESSAGES, generation_mode="text")
    with Omni(path, deploy_config=deploy) as text_only:
        assert [s.name for s in text_only.spec.stages] == ["thinker"]
        thinker = {"thinker": greedy_params()["thinker"]}
        [out] = text_only.generate({"messages": MESSAGES, "voice": "Ethan"}, thinker, use_tqdm=False)
    assert out.token_ids == ref_ids and out.audio is None
    no_audio = SimpleNamespace(config={"enable_audio_output": False})
    assert resolve_qwen2_5_omni(no_audio, PipelineDeployConfig()).name == "qwen2_5_omni_thinker_only"


def test_thinker_text_prompts_chunk_and_hit_the_prefix_cache(path, reference):
    # Text-only thinker requests prefill in chunks (8 tokens a step here) and the second turn
    # reuses the first one's cached blocks; the greedy text stays the reference's.
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.core.types import StageRequest
    from omnistage.models.qwen2_5_omni import THINKER_STAGE

    ref_ids, _ = reference(OTHER, generation_mode="text")
    engine = AREngine(path, THINKER_STAGE, StageDeployConfig(devices=("cpu",), dtype="float32", max_num_seqs=2,
                                                             max_num_batched_tokens=8))
    params = greedy_params()["thinker"]
    for turn in range(2):
        engine.add_request(StageRequest(f"t{turn}", {"messages": OTHER}, params))
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        assert outs[-1].finished and outs[-1].payload.token_ids == ref_ids
        cached = outs[-1].metrics["num_cached_tokens"]
        assert (cached == 0) if turn == 0 else (cached >= 16)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    engine.close()


def test_image_prompts_hit_the_prefix_cache_by_their_pixels(path, reference):
    # The same image and question again reuses the blocks over the image and skips its encoder;
    # another image behind the same placeholder ids hits no block that overlaps it (its digest keys
    # them); a prompt that appends a frame to earlier ones hits the blocks over those and encodes
    # only the images it feeds positions of (and prepares the pixels of those only). Greedy text stays
    # the reference's.
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.core.types import StageRequest
    from omnistage.models.qwen2_5_omni import THINKER_STAGE

    rng = np.random.RandomState(1)
    a, b, c = ((rng.rand(112, 112, 3) * 255).astype(np.uint8) for _ in range(3))  # 16 tokens each

    def prompt(*images):
        parts = [{"type": "image", "image": image} for image in images]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe the image."}]}]

    engine = AREngine(path, THINKER_STAGE, StageDeployConfig(devices=("cpu",), dtype="float32", max_num_seqs=2))
    size, params = engine.block_size, greedy_params()["thinker"]
    encoded = []  # images per vision encoder call
    engine.model.model.model.visual.register_forward_hook(
        lambda module, args, kwargs, out: encoded.append(len(kwargs["grid_thw"])), with_kwargs=True)

    class CountingProcessor:  # the checkpoint's image processor, counting the images it prepares
        def __init__(self, inner):
            self.inner, self.prepared = inner, []

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __call__(self, images, **kwargs):
            self.prepared.append(len(images))
            return self.inner(images=images, **kwargs)

    engine.model.image_processor = processor = CountingProcessor(engine.model.image_processor)

    def run(messages) -> tuple[int, int]:
        """(cached tokens, end of the last image's tokens), after checking the text against the reference."""
        rid = f"r{engine.block_manager.num_prefix_queries}"
        engine.add_request(StageRequest(rid, {"messages": messages}, params))
        last_image_end = engine._seqs[rid].media_spans[-1].end
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        assert outs[-1].payload.token_ids == reference(messages, generation_mode="text")[0]
        return outs[-1].metrics["num_cached_tokens"], last_image_end

    assert run(prompt(a))[0] == 0
    cached, end = run(prompt(a))
    assert cached >= end // size * size > 0  # every full block over the image
    image_start = end - 16
    cached, _ = run(prompt(b))
    assert cached <= image_start // size * size  # none past the block the image starts in
    _, end_ab = run(prompt(a, b))  # hits a's first block, which ends inside a: a is encoded again
    cached, _ = run(prompt(a, b, c))
    assert cached >= end_ab // size * size > image_start + size  # the blocks over frames a and b
    assert encoded == [1, 1, 2, 2]  # a; none (a cached whole); b; a and b; b (partly cached) and c
    assert processor.prepared == encoded  # an image a hit covers is not prepared again either
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    engine.close()


def test_prefix_cache_hits_keep_text_and_waveform(reference, omni):
    # A request that speaks reuses the thinker's cached blocks of an earlier one with the same
    # system prompt, and of itself when repeated; the talker still gets the hidden states and
    # embeddings of every prompt position (stored with the blocks), so text and waveform (and
    # with it the talker's codes, which the waveform is made of) stay the uncached reference's.
    system = {"role": "system", "content": "You are a prefix-cache test. Answer in one short line, please."}
    first = [system, {"role": "user", "content": "Hello, who are you?"}]
    second = [system, {"role": "user", "content": "Tell me a story."}]
    params = greedy_params(talker_tokens=24)
    refs = {id(m): reference(m, talker_max_new_tokens=24) for m in (first, second)}
    cached, talker_cached = [], []
    for messages in (first, second, first):
        [out] = omni.generate({"messages": messages}, params, use_tqdm=False)
        cached.append(out.metrics["stages"]["thinker"]["num_cached_tokens"])
        talker_cached.append(out.metrics["stages"]["talker"]["num_cached_tokens"])
        ref_ids, ref_wav = refs[id(messages)]
        assert out.token_ids == ref_ids
        np.testing.assert_array_equal(out.audio, ref_wav)
    assert cached == [0, 48, 48]  # three blocks of 16: the system prompt's, then up to the last prompt token
    # The talker's prompt is those rows (keyed by their digests): it hits the same blocks.
    assert talker_cached == [0, 48, 48]

    # Aborted after its first output, a hit leaves the thinker's blocks and rows as they were.
    async def abort_after_first_output():
        async for _ in omni.async_omni.generate({"messages": second}, params, request_id="hit-abort"):
            await omni.async_omni.abort("hit-abort")
            break

    asyncio.run(abort_after_first_output())
    thinker, talker = (omni.async_omni.orchestrator.handles[i].endpoint.server.engine for i in (0, 1))
    deadline = time.monotonic() + 10
    while (thinker._seqs or talker._seqs) and time.monotonic() < deadline:  # the orchestrator delivers the abort
        time.sleep(0.01)
    for engine in (thinker, talker):
        blocks = engine.block_manager
        assert not engine._seqs and blocks.num_free_blocks == blocks.num_blocks
        assert all(b.ref_count == 0 for b in blocks.blocks)
    assert not thinker.runner.hidden and not thinker.runner.embeds
    assert all(b.key is not None for b in thinker.block_manager.blocks if b.states)  # stored rows only on cached blocks


def test_text_only_request_runs_the_thinker_alone(reference, omni):
    # The full three-stage pipeline, asked for text: the talker and token2wav never run, and the
    # thinker skips the hidden states it would return for the talker; the text is the reference's.
    ref_ids, _ = reference(MESSAGES, generation_mode="text")
    [out] = omni.generate({"messages": MESSAGES}, greedy_params(), modalities=["text"], use_tqdm=False)
    assert out.error is None and out.token_ids == ref_ids and out.text
    assert out.audio is None and out.sample_rate is None
    assert set(out.metrics["stages"]) == {"thinker"}
    with pytest.raises(ValueError, match="pipeline 'qwen2_5_omni' cannot make 'image'; it makes 'audio', 'text'"):
        omni.generate({"messages": MESSAGES}, greedy_params(), modalities=["image"], use_tqdm=False)


def test_unknown_voice_fails_naming_the_thinker(omni):
    with pytest.raises(OmniRequestError, match=r"thinker.*unknown voice 'Nobody'"):
        omni.generate({"messages": MESSAGES, "voice": "Nobody"}, greedy_params(), use_tqdm=False)



@pytest.fixture(scope="module")
def chat_route(path):
    """(TestClient, engine): one app for the chat route's tests. The route sets the thinker's params
    only; the talker samples with its deploy defaults, here capped (a random talker rarely says its
    end token). The video test's clips carry up to 4 s of audio (the limit is 10 s)."""
    from fastapi.testclient import TestClient

    from omnistage.entrypoints.openai.api_server import ServerSettings, create_app

    engine = AsyncOmni(path, stage_overrides={"1": {"default_sampling_params": {"max_tokens": 48}}})
    app = create_app(ServerSettings(served_model_name="omni", model_path=path, max_input_audio_seconds=10), engine)
    with TestClient(app) as http:  # its lifespan shuts the engine down
        yield http, engine


def test_chat_completions_route_answers_with_audio(chat_route):
    import base64
    import io
    import json

    import soundfile as sf
    from prometheus_client import generate_latest

    http, engine = chat_route
    body = {"messages": MESSAGES, "modalities": ["text", "audio"], "max_tokens": 8, "temperature": 0,
            "audio": {"voice": "Ethan", "format": "wav"}}
    # Text only: the thinker alone runs (no talker or token2wav stage metrics are recorded; the
    # video test sharing the engine asks for text only too).
    resp = http.post("/v1/chat/completions", json={**body, "modalities": ["text"], "audio": None})
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    assert message["content"] and message.get("audio") is None
    # (the replica gauges list every stage whether it ran or not: left out here)
    metrics = "\n".join(line for line in generate_latest(engine.metrics_registry).decode().splitlines()
                         if not line.startswith("omnistage_stage_replica"))
    assert 'stage="thinker"' in metrics and 'stage="talker"' not in metrics and 'stage="token2wav"' not in metrics
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    audio = resp.json()["choices"][0]["message"]["audio"]
    body["stream"], body["audio"] = True, {"voice": "Ethan", "format": "pcm16"}
    with http.stream("POST", "/v1/chat/completions", json=body) as streamed:
        lines = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    wave, rate = sf.read(io.BytesIO(base64.b64decode(audio["data"])))
    assert rate == OMNI_SAMPLE_RATE and len(wave) > 0 and audio["transcript"]
    deltas = [c["choices"][0]["delta"].get("audio") for c in lines if c["choices"]]
    pcm = b"".join(base64.b64decode(d["data"]) for d in deltas if d and d.get("data"))
    assert "".join(d.get("transcript", "") for d in deltas if d) == audio["transcript"]
    assert len(pcm) > 0 and len(pcm) % 960 == 0  # whole codec frames of 24 kHz PCM16


def test_chat_video_url_is_seen_and_heard(chat_route, omni):
    import base64

    from omnistage.media.video import encode_mp4

    mp4 = encode_mp4(moving_frames(16, seed=2), 4.0, audio=tone(4.0), sample_rate=16000)
    url = "data:video/mp4;base64," + base64.b64encode(mp4).decode()
    content = [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "What happens?"}]
    body = {"messages": [{"role": "user", "content": content}], "modalities": ["text"], "max_tokens": 8,
            "temperature": 0, "mm_processor_kwargs": {"use_audio_in_video": True}}
    http, _ = chat_route
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    text = resp.json()["choices"][0]["message"]["content"]
    bad = http.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(b"no video").decode()}}]}]})
    long = http.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(
            encode_mp4(moving_frames(12), 1.0)).decode()}}]}]})
    # The route hands the model the file itself: the same answer as the Python API given the bytes.
    part = {"type": "video", "video": mp4}
    prompt = {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}],
              "use_audio_in_video": True}
    [out] = omni.generate(prompt, {"thinker": SamplingParams(temperature=0, max_tokens=8)}, modalities=["text"],
                          use_tqdm=False)
    assert text == out.text
    for resp, code in ((bad, "invalid_video"), (long, "video_too_long")):
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["param"] == "messages[0].content[0]" and error["code"] == code


@pytest.mark.parametrize("num_codes, finish_reason", [(0, "stop"), (30, "stop"), (48, "stop"), (100, "length"),
                                                      (121, "stop")])
@pytest.mark.parametrize("chunking", [
    dict(), dict(chunk_size=36, first_chunk_size=0), dict(chunk_size=24, left_context=0, right_context=0),
    dict(chunk_size=24, first_chunk_size=0, left_context=0, right_context=0), dict(chunk_size=0),
    dict(first_right_context=0), dict(first_right_context=6), dict(first_chunk_size=0, first_right_context=0)])
def test_talker_chunks_cover_the_utterance_once(num_codes, finish_reason, chunking):
    from omnistage.core.types import TextPayload
    from omnistage.models.qwen2_5_omni.processors import TOKEN2WAV, talker_chunks

    params = Token2WavParams(**chunking)
    request = SimpleNamespace(request_id="r", prompt={"messages": MESSAGES}, params={TOKEN2WAV: params})
    codes = [i % 128 for i in range(num_codes)] + ([130] if finish_reason == "stop" else [])
    parts = []
    for n in range(1, len(codes) + 1):
        done = n == len(codes)
        payload = TextPayload(token_ids=codes[:n], delta_token_ids=codes[n - 1:n],
                              finish_reason=finish_reason if done else None)
        part = talker_chunks(request, payload, done)
        if part is not None:
            parts.append((n, part))
    spans = [(p["options"].start, p["options"].end) for _, p in parts]
    first_right = params.right_context if params.first_right_context is None else params.first_right_context
    assert [s for span in spans for s in range(*span)] == list(range(num_codes))  # in order, each frame once
    for n, part in parts:
        o = part["options"]
        assert part["codes"] == codes[o.offset:o.offset + len(part["codes"])]
        assert o.offset == max(0, o.start - params.left_context) and o.seed == parts[0][1]["options"].seed
        if n < len(codes):  # sent early: its right context is there
            look_ahead = first_right if o.start == 0 else params.right_context
            assert o.offset + len(part["codes"]) == o.end + look_ahead and n == o.end + look_ahead
    if params.chunk_size == 0:
        assert len(parts) == 1
    first = params.first_chunk_size or params.chunk_size
    if params.chunk_size and len(codes) > first + first_right:  # the first chunk goes once its look-ahead is in
        assert spans[0] == (0, first) and parts[0][0] == first + first_right
        assert spans[1][0] == first and (spans[1][1] in (first + params.chunk_size, num_codes))


def test_default_first_chunk_is_one_dit_block_with_its_look_ahead():
    # The default streams the first 12 frames (one DiT block) once 12 more exist: first audio after
    # 24 talker frames, not the 36 + 12 of a steady chunk; the later chunks keep 36 frames.
    params = Token2WavParams()
    assert (params.first_chunk_size, params.chunk_size, params.right_context) == (12, 36, 12)
    assert params.first_right_context is None
    with pytest.raises(ValueError, match="first_right_context"):
        Token2WavParams(first_right_context=13)


def test_prepacked_linears_keep_the_reply(reference, path, monkeypatch):
    """On CPU every stage's linear layers (thinker, talker, token2wav) run through oneDNN with
    prepacked weights (core/cpu_linear.py); the zoo model's are all below the size where
    that pays, so this packs every one of them: the same text as transformers, and its
    waveform up to rounding."""
    from packed_linears import assert_every_stage_packed, pack_every_linear

    pack_every_linear(monkeypatch)
    ref_ids, ref_wav = reference(MESSAGES)
    with Omni(path) as packed:
        assert_every_stage_packed(packed)
        [out] = packed.generate({"messages": MESSAGES}, greedy_params(), use_tqdm=False)
    assert out.token_ids == ref_ids
    assert out.audio.shape == ref_wav.shape
    np.testing.assert_allclose(out.audio, ref_wav, rtol=0, atol=1e-4 * np.abs(ref_wav).max())


def test_mrope_positions_reuse_a_shared_start(omni):
    check_rope_reuse(omni.async_omni.orchestrator.handles[0].endpoint.server.engine.model, with_clip=False)
