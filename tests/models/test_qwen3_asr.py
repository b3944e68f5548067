"""Qwen3-ASR on the tiny zoo checkpoint: greedy token ids and text equal transformers'
`Qwen3ASRForConditionalGeneration.generate` on the prompts its own processor builds
(`apply_transcription_request`), for one clip (detected language; forced language with a
context prompt) and for two clips batched (with a longer third in the same engine batch); and
the transcript and language read from the text as the processor's `decode(return_format="parsed")`
reads them."""

from __future__ import annotations

import pytest
import torch

from omnistage import Omni, SamplingParams
from omnistage.models.qwen3_asr.transcription import LANGUAGES, parse_transcript, transcription_prompt
from omnistage.testing.qwen3_asr_models import QWEN3_ASR_SAMPLE_RATE, asr_clips

MAX_TOKENS = 16
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def path(zoo) -> str:
    return str(zoo("qwen3-asr"))


@pytest.fixture(scope="module")
def reference(path):
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    return AutoProcessor.from_pretrained(path), Qwen3ASRForConditionalGeneration.from_pretrained(path).eval()


@pytest.fixture(scope="module")
def omni(path):
    with Omni(path) as omni:
        yield omni


def generate(reference, clips, language=None, context=None) -> list[list[int]]:
    processor, model = reference
    inputs = processor.apply_transcription_request(audio=clips, language=language, prompt=context)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)
    eos = set(model.generation_config.eos_token_id)
    rows = []
    for row in out[:, inputs["input_ids"].shape[1]:].tolist():  # up to and with the first eos, as omnistage
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


def transcribe(omni, clips, language=None, context=None):
    prompts = [transcription_prompt(clip, QWEN3_ASR_SAMPLE_RATE, language, context) for clip in clips]
    return omni.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)


@pytest.mark.parametrize("language, context", [(None, None), ("en", "Names: Quilter.")])
def test_one_clip_matches_generate(omni, reference, language, context):
    clip = asr_clips((1.5,))
    expected = generate(reference, clip, language, context)[0]
    out = transcribe(omni, clip, language, context)[0]
    assert out.token_ids == expected and len(set(expected)) > 4
    processor = reference[0]
    assert out.text == processor.decode(expected, skip_special_tokens=True)
    parsed = processor.decode(expected, return_format="parsed")
    spoken, transcript = parse_transcript(out.text, language)
    assert transcript == parsed["transcription"]
    assert spoken == (LANGUAGES[language] if language else parsed["language"])


def test_two_clips_batched_match_batched_generate(omni, reference):
    # Equal lengths: the reference pads neither the audio nor the prompts, so its batch is each clip's own run.
    clips = asr_clips((1.0, 1.0))
    expected = generate(reference, clips)
    assert expected[0] != expected[1]  # the audio decides: rows swapped or mixed would differ
    # A longer third clip in the same engine batch: its prompt is longer, so the others' rows are padded.
    longer = asr_clips((1.0, 1.0, 2.5))[2]
    outs = transcribe(omni, [*clips, longer])
    assert [o.token_ids for o in outs] == [*expected, generate(reference, [longer])[0]]


def test_language_table_is_the_processors():
    from transformers.models.qwen3_asr.processing_qwen3_asr import LANGUAGE_CODE_TO_NAME

    assert LANGUAGES == LANGUAGE_CODE_TO_NAME


def test_partial_text_holds_the_language_tag():
    assert parse_transcript("langu", final=False) == (None, "")
    assert parse_transcript("language Eng", final=False) == (None, "")
    assert parse_transcript("language English<asr_text> Hel", final=False) == ("English", "Hel")
    assert parse_transcript("language None<asr_text>", final=True) == (None, "")
    assert parse_transcript("language Eng", final=True) == (None, "language Eng")  # never finished the tag


def test_the_same_clip_again_hits_the_prefix_cache(omni, reference):
    # Equal lengths: the two clips' prompts have the same token ids, so only the clip's digest in
    # the block keys keeps the second clip off the first one's blocks over the audio. A hit over the
    # whole clip skips the audio encoder.
    clips = asr_clips((1.25, 1.25))
    engine = omni.async_omni.orchestrator.handles[0].endpoint.server.engine
    encoded = []  # audio encoder calls
    hook = engine.model.model.model.audio_tower.register_forward_hook(lambda *_: encoded.append(1))
    runs = [transcribe(omni, [clip])[0] for clip in (clips[0], clips[0], clips[1])]
    hook.remove()
    assert [r.token_ids for r in runs] == [generate(reference, [clips[i]])[0] for i in (0, 0, 1)]
    cached = [r.metrics["stages"]["asr"]["num_cached_tokens"] for r in runs]
    assert cached[0] == 0 and cached[1] >= 32  # the blocks up to the last prompt token, the audio's too
    assert cached[2] == 0  # the audio starts in the first block
    assert len(encoded) == 2  # the clip again: the hit covers its audio, which is not encoded again
