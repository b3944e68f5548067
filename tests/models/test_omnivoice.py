"""OmniVoice on the tiny zoo checkpoint: parity with the authors' `omnivoice` 0.2.1 (the target
length, the unmasked codes and the waveform), alone with a seed (plain, a described voice, a
cloned voice, sampled codes) and batched; a request's codes do not depend on its batch.

The reference is the authors' package, vendored at test time (tests/models/omnivoice_reference.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage import Omni
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.omnivoice.decoding import UnmaskParams
from omnistage.models.omnivoice.speaker import OmniVoiceSpeaker, SpeechRequest, Voice
from omnivoice_reference import reference_model

REFERENCE_CACHE = Path(__file__).resolve().parents[2] / ".omnistage-cache"
NUM_STEP = 8  # the authors' 32, fewer for time: every step runs the same code
REF_TEXT = "This is my voice."


@pytest.fixture(scope="module")
def omnivoice(zoo):
    return str(zoo("omnivoice"))


@pytest.fixture(scope="module")
def speaker(omnivoice):
    return OmniVoiceSpeaker(omnivoice)


@pytest.fixture(scope="module")
def reference(omnivoice):
    return reference_model(REFERENCE_CACHE, omnivoice)


@pytest.fixture(scope="module")
def voice():
    g = torch.Generator().manual_seed(3)
    return Voice(REF_TEXT, torch.randint(0, 32, (4, 20), generator=g), ref_rms=0.05)


@torch.inference_mode()  # as the authors' `generate`
def _reference_run(reference, requests: list[SpeechRequest], seed: int | None, params: UnmaskParams,
                   clip: tuple[np.ndarray, str] | None = None):
    """The authors' target lengths, codes and waveforms for `requests` in one batch (with
    `clip`, one request cloning a 24 kHz clip with its transcript)."""
    module, model = reference
    config = module.OmniVoiceGenerationConfig(postprocess_output=False, pad_duration=0.0, fade_duration=0.0,
                                              **vars(params))
    voices = [r.voice for r in requests]
    prompts = None if voices[0] is None else [
        module.VoiceClonePrompt(ref_audio_tokens=v.ref_codes, ref_text=v.ref_text, ref_rms=v.ref_rms) for v in voices]
    # Without preprocessing (silence removal, which needs pydub; the transcript ends in a full stop).
    ref_audio = None if clip is None else [(torch.from_numpy(clip[0])[None], 24000)]
    task = model._preprocess_all(text=[r.text for r in requests], instruct=[r.instruct for r in requests],
                                 voice_clone_prompt=prompts, ref_audio=ref_audio,
                                 ref_text=None if clip is None else [clip[1]], preprocess_prompt=False)
    if seed is not None:
        torch.manual_seed(seed)
    codes = model._generate_iterative(task, config)
    waves = [model._decode_and_post_process(c, rms, config) for c, rms in zip(codes, task.ref_rms)]
    return task.target_lens, codes, waves


CASES = {
    "plain": (SpeechRequest("Hello there, how are you today?", seed=0), None),
    "designed": (SpeechRequest("The sun rises in the east.", instruct="female, low pitch", seed=1), None),
    "sampled": (SpeechRequest("Good morning!", seed=5), UnmaskParams(num_step=NUM_STEP, class_temperature=0.8)),
}


@pytest.mark.parametrize("case", [*CASES, "cloned"])
def test_alone_matches_reference(speaker, reference, voice, case):
    request, params = CASES.get(case, (SpeechRequest("Nice to see you again.", voice=voice, seed=2), None))
    params = params or UnmaskParams(num_step=NUM_STEP)
    request = SpeechRequest(**{**vars(request), "params": params})
    (target_len,), (ref_codes,), (ref_wave,) = _reference_run(reference, [request], request.seed, params)
    codes = speaker.codes([request])[0]
    assert codes.shape == (4, target_len)
    # The codes vary (the tiny model does not repeat one code), and all were unmasked.
    assert len(torch.unique(codes)) > 4 and int(codes.max()) < 32
    torch.testing.assert_close(codes, ref_codes, rtol=0, atol=0)
    wave = speaker.audio(codes, request.voice)
    np.testing.assert_allclose(wave, ref_wave, rtol=1e-4, atol=1e-5)


def test_batched_matches_reference(speaker, reference, voice):
    """Positions picked without noise: the authors' batched unmasking is deterministic, so it
    compares row by row with ours (lengths differ, so rows are padded)."""
    params = UnmaskParams(num_step=NUM_STEP, position_temperature=0.0)
    requests = [SpeechRequest(text, instruct=instruct, params=params)
                for text, instruct in (("Hi!", None), ("A much longer sentence to read aloud, slowly.", "male"),
                                       ("Numbers like 42 count more.", None))]
    lens, ref_codes, _ = _reference_run(reference, requests, None, params)
    assert len(set(lens)) == 3
    for codes, expected in zip(speaker.codes(requests), ref_codes):
        torch.testing.assert_close(codes, expected, rtol=0, atol=0)


def test_codes_do_not_depend_on_the_batch(speaker):
    """Each request draws its position noise from its own seeded generator."""
    params = UnmaskParams(num_step=NUM_STEP)
    first = SpeechRequest("Hello there, how are you today?", seed=0, params=params)
    other = SpeechRequest("Something else entirely.", seed=9, params=params)
    alone = speaker.codes([first])[0]
    batched = speaker.codes([other, first])[1]
    torch.testing.assert_close(batched, alone, rtol=0, atol=0)


def test_served_audio_matches_reference(omnivoice, reference):
    """Through `Omni` (the unmasking stage on the diffusion engine, the codec stage streaming a
    second of frames at a time), two requests batched: a plain one and one cloning a clip.
    The served audio is the codec's, without the authors' peak normalisation of an uncloned
    voice (it needs the whole waveform): compared after it."""
    clip = (0.05 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)).astype(np.float32), REF_TEXT
    plain = SpeechRequest("Hello there, how are you today? I am fine.", seed=0, params=UnmaskParams(num_step=NUM_STEP))
    cloned = SpeechRequest("Nice to see you again.", seed=2,
                           params=UnmaskParams(num_step=NUM_STEP, class_temperature=0.8))  # an extra, sampled codes
    (_,), _, (plain_wave,) = _reference_run(reference, [plain], plain.seed, plain.params)
    (_,), _, (cloned_wave,) = _reference_run(reference, [cloned], cloned.seed, cloned.params, clip)
    prompts = [plain.text, {"prompt": cloned.text, "ref_audio": clip[0], "ref_sample_rate": 24000,
                            "ref_text": clip[1]}]
    params = [{"unmask": DiffusionParams(seed=plain.seed, num_inference_steps=NUM_STEP)},
              {"unmask": DiffusionParams(seed=cloned.seed, num_inference_steps=NUM_STEP,
                                         extras={"class_temperature": 0.8})}]
    with Omni(omnivoice) as omni:
        outputs = omni.generate(prompts, params, use_tqdm=False)
    assert [o.sample_rate for o in outputs] == [24000, 24000]
    served = outputs[0].audio / np.abs(outputs[0].audio).max() * 0.5
    assert served.shape == plain_wave.shape and plain_wave.shape[0] > 2 * 24000  # streamed in several chunks
    np.testing.assert_allclose(served, plain_wave, atol=1e-4)
    # The quiet clip (RMS 0.035) scales the cloned voice's audio by its RMS / 0.1, as the authors do.
    np.testing.assert_allclose(outputs[1].audio, cloned_wave, atol=1e-5)
