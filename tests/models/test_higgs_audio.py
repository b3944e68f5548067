"""Higgs-Audio v2 on the tiny zoo checkpoint: parity with transformers' own `generate` and
processor decoding (codes and waveform, greedy), alone and batched, with a scene and with a
cloned voice; prompts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import Omni
from omnistage.ar import SamplingParams
from omnistage.ar.engine import AREngine
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import StageRequest
from omnistage.media.audio import resample
from omnistage.models.higgs_audio import HIGGS_AUDIO
from omnistage.models.higgs_audio.prompt import parse_prompt

TEXT = "The sun rises in the east."
SCENED = {"prompt": "Hello world! How are you today?", "instructions": "Audio is recorded in a busy street."}
# At 16 kHz: the talker resamples it to the tokenizer's 24 kHz (the reference is given it at 24 kHz).
_t = np.arange(16000) / 16000
CLIP = (0.3 * np.sin(2 * np.pi * 220 * _t) + 0.05 * np.random.RandomState(0).randn(_t.size)).astype(np.float32)
CLONED = {"prompt": TEXT, "ref_audio": CLIP, "ref_sample_rate": 16000, "ref_text": "This is my voice."}
# 24 rows: the all-BOS row, then 23 delayed rows -> 20 frames (TEXT runs to max_tokens; SCENED ends
# its stream earlier, so both ways of stopping are compared).
NUM_ROWS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_ROWS)


@pytest.fixture(scope="module")
def higgs(zoo):
    return str(zoo("higgs-audio-v2"))


@pytest.fixture(scope="module")
def reference(higgs):
    from higgs_audio_reference import HiggsReference

    ref = HiggsReference(higgs)
    results = []
    for prompt in (TEXT, SCENED, CLONED):  # one at a time: each request's own greedy run
        clips = [resample(CLIP, 16000, 24000)] if prompt is CLONED else None
        codes, [wav] = ref.generate([parse_prompt(prompt).conversation()], NUM_ROWS, clips)
        results.append((ref.frames(codes[0]), wav))
    return results


@pytest.fixture(scope="module")
def omni(higgs):
    """Both stages with every linear layer prepacked for oneDNN (core/cpu_linear.py; the zoo's are all
    below the size where that pays), so the waveform parity covers the packed layers too."""
    from packed_linears import assert_every_stage_packed, pack_every_linear

    with pytest.MonkeyPatch.context() as mp:
        pack_every_linear(mp)
        omni = Omni(higgs, stage_overrides={"*": {"max_num_seqs": 4}})
    with omni:
        assert_every_stage_packed(omni)
        yield omni


def _talker_codes(engine: AREngine, prompts: list) -> tuple[list[torch.Tensor], int]:
    """Each prompt's frames from the talker's AR engine alone, run as one batch; and the largest batch."""
    for i, prompt in enumerate(prompts):
        engine.add_request(StageRequest(str(i), prompt, GREEDY))
    codes, largest = {}, 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        largest = max(largest, len(outputs))
        for out in outputs:
            if out.finished:
                codes[out.request_id] = out.payload.extras["audio_codes"]
    return [codes[str(i)] for i in range(len(prompts))], largest


def test_codes_and_waveform_match_transformers(higgs, reference, omni):
    ref_codes = [codes for codes, _ in reference]
    assert ref_codes[0].shape == (NUM_ROWS - 1 - 3, 4) and len(set(ref_codes[0][:, 0].tolist())) > 5  # varied
    assert ref_codes[1].shape == (18, 4)  # this one ends its stream: an all-EOS row after 22 rows
    assert not torch.equal(ref_codes[0], ref_codes[1]) and not torch.equal(ref_codes[0], ref_codes[2])

    engine = AREngine(higgs, HIGGS_AUDIO.stages[0], StageDeployConfig(max_num_seqs=3))
    assert engine.model.audio_frame_rate == 24000 / (8 * 5 * 4 * 2 * 3)  # the zoo codec's frames: deadline order
    [alone], _ = _talker_codes(engine, [TEXT])
    assert torch.equal(alone, ref_codes[0])
    batched, largest = _talker_codes(engine, [TEXT, SCENED, CLONED])
    engine.close()
    assert largest == 3  # all in every step (the prompts differ in length)
    for ours, ref in zip(batched, ref_codes):
        assert torch.equal(ours, ref)

    # The codec decodes the streamed chunks (2 frames, then 8) with left context and a
    # lookahead: the reference's one-shot decode.
    outputs = omni.generate([TEXT, SCENED, CLONED], {"talker": GREEDY}, use_tqdm=False)
    for out, (_, wav) in zip(outputs, reference):
        assert out.sample_rate == 24000 and out.audio.dtype == np.float32
        assert out.audio.shape == wav.shape
        np.testing.assert_allclose(out.audio, wav, atol=1e-4 * np.abs(wav).max())


def test_repetition_aware_sampling_matches_transformers(higgs, reference, tmp_path):
    """A checkpoint whose generation config asks for repetition-aware sampling (the released one
    does: window 7, at most 2 repeats): repeated codes are redrawn from torch's global generator,
    in the reference's order, so with the same seed the codes are the reference's."""
    import json
    import shutil

    from higgs_audio_reference import HiggsReference

    path = tmp_path / "ras"
    shutil.copytree(higgs, path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, "ras_win_len": 7,
                                                             "ras_win_max_num_repeat": 2}))
    ref = HiggsReference(str(path))
    torch.manual_seed(0)
    codes, _ = ref.generate([parse_prompt(TEXT).conversation()], NUM_ROWS)
    expected = ref.frames(codes[0])
    engine = AREngine(str(path), HIGGS_AUDIO.stages[0], StageDeployConfig(max_num_seqs=1))
    engine.add_request(StageRequest("r", TEXT, GREEDY))
    torch.manual_seed(0)
    while engine.has_unfinished_requests():
        for out in engine.step():
            ours = out.payload.extras["audio_codes"]
    engine.close()
    assert torch.equal(ours, expected)
    assert not torch.equal(ours, reference[0][0])  # some codes were redrawn


@pytest.mark.parametrize("prompt, param", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": "hi", "instructions": " "}, "instructions"),
    ({"prompt": "hi", "ref_audio": np.zeros((2, 10), np.float32), "ref_sample_rate": 24000}, "ref_audio"),
    ({"prompt": "hi", "ref_audio": np.zeros(10, np.float32)}, "ref_sample_rate"),
    ({"prompt": "hi", "ref_text": "words"}, "ref_text"),
    ({"prompt": "hi", "speed": 2}, "speed"),
    (["hi"], "prompt"),
])
def test_bad_prompts_name_the_key(prompt, param):
    from omnistage.core.errors import RequestError

    with pytest.raises(RequestError) as info:
        parse_prompt(prompt)
    assert info.value.param == param
