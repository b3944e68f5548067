"""Fish Speech's dual-AR talker on a tiny checkpoint in the authors' format: parity with the
authors' `fish-speech` 0.1.0 (`generate`, same seed: every frame's semantic token and codes),
alone and batched, sampled (with and without the repetition penalty) and greedy; refused
params and prompts; the codec's waveform (their modded DAC decode, one-shot and chunked) and
both stages through `Omni` against their decode of their frames.

The reference is the authors' package (and descript-audio-codec's quantizer), vendored at
test time (tests/models/fish_speech_reference.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.ar import SamplingParams
from omnistage.ar.engine import AREngine
from omnistage.config import StageSpec
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.errors import RequestError
from omnistage.core.types import StageRequest
from omnistage.models.fish_speech.prompt import FishTokenizer, parse_prompt
from fish_speech_reference import authors_codec, authors_prompt, module

REFERENCE_CACHE = Path(__file__).resolve().parents[2] / ".omnistage-cache"

MAX_STEPS = 16
TEXTS = ("Hello world! How are you today?", "Good morning to you.", "one two three", "Is this the one?")
SEEDS = (0, 1, 5, 0)
TEMPERATURES = (0.8, 0.7, 0.8, 0.0)  # 0: greedy (the authors' floor, 1e-5, in the reference)
PENALTIES = (1.1, 1.0, 1.5, 1.2)
TOP_P = 0.8
TALKER = StageSpec(id=0, name="talker", kind="ar", output="tokens", model="fish_speech.talker", final_output=True)


@pytest.fixture(scope="module")
def fish_speech(tmp_path_factory):
    from omnistage.testing.fish_speech_models import build_fish_speech

    path = tmp_path_factory.mktemp("fish-speech")
    build_fish_speech(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(fish_speech):
    """Each prompt's generated rows [1 + codebooks, steps] from the authors' eager `generate`, seeded."""
    llama, inference = (module(REFERENCE_CACHE, m) for m in ("llama", "inference"))
    model = llama.DualARTransformer.from_pretrained(fish_speech, load_weights=True).eval()
    weights = torch.load(f"{fish_speech}/model.pth", weights_only=True)
    assert set(model.state_dict()) == set(weights)  # every checkpoint tensor loaded (theirs is strict=False)
    results = []
    for text, seed, temperature, penalty in zip(TEXTS, SEEDS, TEMPERATURES, PENALTIES):
        encoded, audio_masks, audio_parts = authors_prompt(REFERENCE_CACHE, model, text)
        torch.manual_seed(seed)
        y = inference.generate(model=model, prompt=encoded, max_new_tokens=MAX_STEPS, audio_masks=audio_masks,
                               audio_parts=audio_parts, temperature=max(temperature, 1e-5), top_p=TOP_P,
                               repetition_penalty=penalty)
        results.append((encoded[0].tolist(), y[:, encoded.shape[1]:].long()))
    return results


def _talker(engine: AREngine, count: int):
    """The first `count` prompts' (prompt ids, tokens, frames) from the AR engine, as one batch; and the largest batch."""
    for i in range(count):
        params = SamplingParams(temperature=TEMPERATURES[i], top_p=TOP_P, repetition_penalty=PENALTIES[i],
                                max_tokens=MAX_STEPS, seed=SEEDS[i])
        engine.add_request(StageRequest(str(i), TEXTS[i], params))
    done, largest = {}, 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        largest = max(largest, len(outputs))
        for out in outputs:
            if out.finished:
                done[out.request_id] = (out.payload.token_ids, out.payload.extras["audio_codes"])
    return [done[str(i)] for i in range(count)], largest


def test_tokens_and_codes_match_the_authors(fish_speech, reference):
    engine = AREngine(fish_speech, TALKER, StageDeployConfig(max_num_seqs=4))
    im_end = engine.model.text_tokenizer.im_end_id
    prompt = engine.model.build_prompt(TEXTS[0]).token_ids
    assert prompt == reference[0][0]  # the authors' ContentSequence
    [alone], _ = _talker(engine, 1)
    batched, largest = _talker(engine, len(TEXTS))
    # Params the authors' sampler has no place for are refused by name, not ignored.
    for change in ({"top_k": 5}, {"min_p": 0.1}, {"min_tokens": 2}):
        with pytest.raises(RequestError) as info:
            engine.add_request(StageRequest("refused", TEXTS[0], SamplingParams(max_tokens=4, **change)))
        assert info.value.param == next(iter(change))
    engine.close()
    assert largest == len(TEXTS)
    for i, ((tokens, frames), (_, rows)) in enumerate(zip([alone] + batched, reference[:1] + reference)):
        assert tokens == rows[0].tolist(), i
        ends = rows[0, -1] == im_end
        assert torch.equal(frames, rows[1:, :rows.shape[1] - int(ends)].T)
    # Not a degenerate reply (greedy included): varied semantic tokens and codes in every codebook.
    for _, rows in reference:
        assert all(len(set(r.tolist())) >= MAX_STEPS // 2 for r in (rows[0], *rows[2:]))


@pytest.mark.parametrize("prompt, param", [
    ({"prompt": " \n "}, "prompt"),
    ({"prompt": "hi", "instructions": "warm"}, "instructions"),
    ({"prompt": "hi", "ref_text": "words"}, "ref_text"),
    ({"prompt": "hi", "speed": 2}, "speed"),
    (["hi"], "prompt"),
])
def test_bad_prompts_name_the_key(prompt, param):
    with pytest.raises(RequestError) as info:
        parse_prompt(prompt)
    assert info.value.param == param


@pytest.fixture(scope="module")
def reference_codec(fish_speech):
    """The authors' decoder modules at the tiny codec's sizes, codec.pth loaded as they load it
    (tests/models/fish_speech_reference.py)."""
    both, loaded = authors_codec(REFERENCE_CACHE, fish_speech)
    assert not loaded.unexpected_keys
    # Unwritten: the encoder side of the quantizer (its input projections, downsampling and
    # pre_module) and the transformer's constant buffers, which it builds itself.
    assert all(".in_proj." in k or k.startswith(("quantizer.downsample.", "quantizer.pre_module."))
               or k.endswith((".freqs_cis", ".causal_mask")) for k in loaded.missing_keys)
    return both["quantizer"], both["decoder"]


def test_codec_waveform_matches_the_authors(fish_speech, reference_codec):
    """Codes -> waveform: the authors' one-shot decode, ours one-shot and streamed in chunks; and
    the window-limited transformer past its 128-frame window, streamed against theirs."""
    from omnistage.models.fish_speech.codec import FishCodec

    quantizer, decoder = reference_codec
    codec = FishCodec.load(fish_speech, None, torch.device("cpu"), torch.float32, 1)
    assert codec.sample_rate == 44100 and codec.hop_length == 2048
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 1024, (12, 4), generator=g)
    with torch.inference_mode():
        wav = decoder(quantizer.decode(codes.T[None]))[0, 0].numpy()
    assert wav.shape == (12 * 2048,) and wav.std() > 1e-3
    one_shot = codec.decode([codec.parse(codes)], [codec.open_stream()])[0]
    stream = codec.open_stream()
    chunked = np.concatenate([codec.decode([part], [stream])[0] for part in codec.parse(codes).split([1, 2, 9])])
    for ours in (one_shot, chunked):
        np.testing.assert_allclose(ours, wav, atol=1e-5 * np.abs(wav).max())

    codes = torch.randint(0, 1024, (140, 4), generator=g)
    with torch.inference_mode():
        z = quantizer.semantic_quantizer.from_codes(codes.T[None, :1])[0]
        z = quantizer.post_module(z + quantizer.quantizer.from_codes(codes.T[None, 1:])[0])[0].T
        caches = [None] * len(codec.model.transformer.layers)
        ours = torch.cat([codec.model.transformer(codec.model.embed(part), caches, start)[0]
                          for start, part in zip((0, 100, 130), codes.split([100, 30, 10]))])
    torch.testing.assert_close(ours, z, rtol=0, atol=1e-5 * z.abs().max().item())

    with pytest.raises(ValueError, match="codes must be in"):
        codec.parse(torch.tensor([[0, 0, 0, 1024]]))


def test_pipeline_speaks_the_authors_frames(fish_speech, reference, reference_codec):
    """Both stages through `Omni`: the talker's frames streamed to the codec in chunks (1 frame,
    then 2 at a time) give the authors' decode of the authors' generated frames."""
    from omnistage import Omni
    from omnistage.models.talker_codec import FrameChunkParams

    quantizer, decoder = reference_codec
    with Omni(fish_speech, stage_overrides={"*": {"max_num_seqs": 2}}) as omni:
        params = [{"talker": SamplingParams(temperature=TEMPERATURES[i], top_p=TOP_P, repetition_penalty=PENALTIES[i],
                                            max_tokens=MAX_STEPS, seed=SEEDS[i]),
                   "codec": FrameChunkParams(1, 2)} for i in range(2)]
        outputs = omni.generate(list(TEXTS[:2]), params, use_tqdm=False)
    im_end = FishTokenizer(Path(fish_speech)).im_end_id
    for out, (_, rows) in zip(outputs, reference[:2]):
        frames = rows[1:, :rows.shape[1] - int(rows[0, -1] == im_end)]  # the <|im_end|> step is no frame
        with torch.inference_mode():
            wav = decoder(quantizer.decode(frames[None]))[0, 0].numpy()
        assert out.sample_rate == 44100 and out.audio.dtype == np.float32
        assert out.audio.shape == wav.shape == (frames.shape[1] * 2048,)
        np.testing.assert_allclose(out.audio, wav, atol=1e-5 * np.abs(wav).max())
