"""VoxCPM2 on the tiny zoo checkpoint: parity with the authors' `voxcpm` package (patches and
waveform, same seed), alone and batched, zero-shot, with a designed voice and with a voice
cloned both ways (reference, reference + continuation); streamed audio equals the authors'
one-shot decode; prompts.

The reference is the authors' package, vendored at test time (tests/models/voxcpm2_reference.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from omnistage import Omni
from omnistage.ar import SamplingParams
from omnistage.ar.engine import AREngine
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import StageRequest
from omnistage.models.qwen3_omni.params import Code2WavParams
from omnistage.models.voxcpm2 import VOXCPM2
from omnistage.models.voxcpm2.prompt import parse_prompt
from voxcpm2_reference import reference_model

# Where the reference wheel and its adapted copy are kept (beside the zoo cache).
REFERENCE_CACHE = Path(__file__).resolve().parents[2] / ".omnistage-cache"

MAX_PATCHES = 6  # two prompts stop earlier (4 patches), two run to it
TEXT = "Hello world! How are you today?"
DESIGNED = {"prompt": "The sun rises in the east.", "instructions": "a calm, deep voice"}
# At the VAE's 16 kHz: 330 samples (the tiny VAE's patches are 16 samples, so 21 patches, the last
# padded: on the right as the reference, on the left as the continuation prompt).
_t = np.arange(330) / 16000
CLIP = (0.3 * np.sin(2 * np.pi * 220 * _t) + 0.05 * np.random.RandomState(0).randn(_t.size)).astype(np.float32)
CLONED = {"prompt": "Please describe the image in one sentence.", "ref_audio": CLIP, "ref_sample_rate": 16000}
CONTINUED = {**CLONED, "prompt": "The quick brown fox.", "ref_text": "This is my voice."}
PROMPTS = (TEXT, DESIGNED, CLONED, CONTINUED)
SEEDS = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def voxcpm2(zoo):
    return str(zoo("voxcpm2"))


@pytest.fixture(scope="module")
def reference(voxcpm2, tmp_path_factory):
    """Each prompt's (patches, waveform) from the authors' `_generate_with_prompt_cache`, seeded."""
    ref = reference_model(REFERENCE_CACHE, voxcpm2)
    clip = tmp_path_factory.mktemp("voxcpm2") / "clip.wav"
    sf.write(clip, CLIP, 16000, subtype="FLOAT")
    results = []
    for prompt, seed in zip(PROMPTS, SEEDS):
        p = parse_prompt(prompt)  # the designed voice's text: "(instructions)text", as the authors' CLI
        cache = None
        if p.mode == "reference":
            cache = ref.build_prompt_cache(reference_wav_path=str(clip))
        elif p.mode == "ref_continuation":
            cache = ref.build_prompt_cache(prompt_text=p.ref_text, prompt_wav_path=str(clip),
                                           reference_wav_path=str(clip))
        torch.manual_seed(seed)
        gen = ref._generate_with_prompt_cache(target_text=p.text, prompt_cache=cache, max_len=MAX_PATCHES)
        wav, _, patches = next(gen)
        gen.close()
        results.append((patches, wav[0].numpy()))
    return results


def _params(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=MAX_PATCHES, seed=seed)


def _talker_patches(engine: AREngine, prompts, seeds) -> tuple[list[torch.Tensor], int]:
    """Each prompt's patches from the talker's AR engine alone, run as one batch; and the largest batch."""
    for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
        engine.add_request(StageRequest(str(i), prompt, _params(seed)))
    patches, largest = {}, 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        largest = max(largest, len(outputs))
        for out in outputs:
            if out.finished:
                patches[out.request_id] = out.payload.extras["audio_codes"]
    return [patches[str(i)] for i in range(len(prompts))], largest


def test_patches_and_waveform_match_the_authors(voxcpm2, reference):
    lengths = [patches.shape[0] for patches, _ in reference]
    assert all(3 < n for n in lengths) and MAX_PATCHES in lengths and min(lengths) < MAX_PATCHES, lengths
    engine = AREngine(voxcpm2, VOXCPM2.stages[0], StageDeployConfig(max_num_seqs=4))
    assert engine.model.audio_frame_rate == 48000 / (2 * 24)  # the zoo's patch (2 latent frames) voices 1 ms
    [alone], _ = _talker_patches(engine, [TEXT], [SEEDS[0]])
    torch.testing.assert_close(alone, reference[0][0], rtol=0, atol=1e-5)
    batched, largest = _talker_patches(engine, PROMPTS, SEEDS)
    engine.close()
    assert largest == len(PROMPTS)  # all in every step (the prompts differ in length)
    for ours, (ref, _) in zip(batched, reference):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)

    # The VAE decodes the streamed chunks (1 patch, then 2 at a time) with left context only:
    # the authors' one-shot decode, a continuation's context patches cut.
    with Omni(voxcpm2, stage_overrides={"*": {"max_num_seqs": 4}}) as omni:
        params = [{"talker": _params(seed), "vae": Code2WavParams(1, 2)} for seed in SEEDS]
        outputs = omni.generate(list(PROMPTS), params, use_tqdm=False)
    for out, (patches, wav) in zip(outputs, reference):
        assert out.sample_rate == 48000 and out.audio.dtype == np.float32
        assert out.audio.shape == wav.shape == (patches.shape[0] * 2 * 24,)
        np.testing.assert_allclose(out.audio, wav, atol=1e-5 * np.abs(wav).max())


@pytest.mark.parametrize("prompt, param", [
    ({"prompt": " "}, "prompt"),
    ({"prompt": "hi", "instructions": ""}, "instructions"),
    ({"prompt": "hi", "instructions": "warm", "ref_audio": CLIP, "ref_sample_rate": 16000, "ref_text": "x"},
     "instructions"),
    ({"prompt": "hi", "ref_audio": np.zeros((2, 10), np.float32), "ref_sample_rate": 16000}, "ref_audio"),
    ({"prompt": "hi", "ref_audio": CLIP}, "ref_sample_rate"),
    ({"prompt": "hi", "ref_text": "words"}, "ref_text"),
    ({"prompt": "hi", "speed": 2}, "speed"),
    (["hi"], "prompt"),
])
def test_bad_prompts_name_the_key(prompt, param):
    from omnistage.core.errors import RequestError

    with pytest.raises(RequestError) as info:
        parse_prompt(prompt)
    assert info.value.param == param


def test_designed_voice_is_a_parenthesised_prefix():
    assert parse_prompt({"prompt": "Hi\n  there", "instructions": " warm "}).text == "(warm)Hi there"
