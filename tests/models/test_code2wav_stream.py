"""Streamed code2wav (Qwen3-Omni's, and Qwen3-TTS's codec on top of it) with its state carried from chunk
to chunk: ragged chunks of several streams in shared passes equal the one-shot forward, a chunk costs its
own frames, the transformer keeps at most a window of keys, and a stream's state goes when it ends or is
aborted."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import StageRequest
from omnistage.generation.engine import GenerationEngine
from omnistage.models.qwen3_omni.code2wav import Code2Wav
from omnistage.models.qwen3_omni.weights import load_code2wav
from omnistage.models.qwen3_tts import STAGES
from omnistage.models.qwen3_tts.codec import Qwen3TTSCodec
from omnistage.models.qwen3_tts.modeling import load_codec_decoder

CPU = torch.device("cpu")
WINDOW = 6  # shorter than the streams, so keys leave the window (the zoo's 72 is longer than any test utterance)


@pytest.fixture(scope="module")
def tts_path(zoo):
    return str(zoo("qwen3-tts-custom-voice"))


def _lively(model: torch.nn.Module) -> torch.nn.Module:
    """The zoo's random decoder makes nearly a constant (layer scales of 0.01, small convolutions): weights
    redrawn so that its audio depends plainly on the codes and on the window, without clipping."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("scale", "gamma")):
                p.fill_(1.0)
            elif name.endswith(("alpha", "beta")):
                p.zero_()
            elif p.ndim >= 2 and "embedding" not in name and "codebook" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.7 / p[0].numel() ** 0.5)
    model.config.sliding_window = WINDOW  # the one-shot forward's mask reads it too
    return model


def _tts(path: str) -> Qwen3TTSCodec:
    return Qwen3TTSCodec(_lively(load_codec_decoder(path, CPU)[0]), CPU)


def _omni(path: str) -> Code2Wav:
    return Code2Wav(_lively(load_code2wav(path, CPU)), CPU)


@torch.inference_mode()
def _stream_ragged(dec: Code2Wav, codes: list[torch.Tensor]) -> list[np.ndarray]:
    """Each stream cut in chunks of changing sizes; every step one padded pass over the streams with frames left."""
    states = [dec.open_stream() for _ in codes]
    pieces, pos, sizes, k = [[] for _ in codes], [0] * len(codes), [1, 5, 3, 9, 2, 12], 0
    while any(p < c.shape[0] for p, c in zip(pos, codes)):
        rows = [i for i in range(len(codes)) if pos[i] < codes[i].shape[0]]
        chunks = []
        for i in rows:
            chunks.append(codes[i][pos[i]:pos[i] + sizes[(k + i) % len(sizes)]])
            pos[i] += chunks[-1].shape[0]
        # `_pass` pads the ragged rows into one pass (`decode` would group them by length first).
        for i, audio in zip(rows, dec._pass(chunks, [states[i] for i in rows])):
            pieces[i].append(audio)
        k += 1
    for s in states:
        assert all(keys is None or keys.shape[1] <= WINDOW - 1 for keys in s.kv.keys)  # bounded by the window
        dec.close_stream(s)
    assert not dec.live
    return [np.concatenate(p) for p in pieces]


@pytest.mark.parametrize("family", ["qwen3-tts", "qwen3-omni"])
def test_ragged_streams_in_shared_passes_equal_the_one_shot_forward(zoo, tts_path, family):
    dec = _tts(tts_path) if family == "qwen3-tts" else _omni(str(zoo("qwen3-omni")))
    g = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, dec.codebook_size, (n, dec.num_quantizers), generator=g) for n in (20, 11, 15)]
    with torch.inference_mode():
        whole = [dec.model(c.T[None]).reshape(-1).numpy() for c in codes]
    for audio, ref in zip(_stream_ragged(dec, codes), whole):
        assert audio.shape == ref.shape
        np.testing.assert_allclose(audio, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    dec.model.config.sliding_window = 72  # the window is exercised: a longer one decodes other audio
    with torch.inference_mode():
        wide = dec.model(codes[0].T[None]).reshape(-1).numpy()
    assert np.abs(wide - whole[0]).max() > 0.01 * np.abs(whole[0]).max()


def test_a_chunk_costs_its_own_frames(tts_path):
    dec = _tts(tts_path)
    seen = []
    dec.model.pre_transformer.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, dec.codebook_size, (40, dec.num_quantizers), generator=g)
    state = dec.open_stream()
    for start in range(0, 40, 10):
        dec.decode([codes[start:start + 10]], [state])
    assert seen == [10, 10, 10, 10]  # no left context decoded again
    # A cloned voice's reference codes are decoded once, with the first frames, and their audio cut.
    context = codes[:7]
    state = dec.open_stream({"context_codes": context})
    first = dec.decode([codes[7:12]], [state])[0]
    later = dec.decode([codes[12:20]], [state])[0]
    assert seen[4:] == [12, 8]
    with torch.inference_mode():
        whole = dec.model(codes[:20].T[None]).reshape(-1).numpy()[7 * 1920:]
    np.testing.assert_allclose(np.concatenate([first, later]), whole, rtol=0, atol=1e-5 * np.abs(whole).max())


def test_stream_state_is_freed_when_its_request_ends_or_is_aborted(tts_path):
    engine = GenerationEngine(tts_path, STAGES[1], StageDeployConfig(devices=("cpu",), max_num_seqs=2))
    codes = torch.randint(0, engine.decoder.codebook_size, (8, engine.decoder.num_quantizers))
    engine.add_request(StageRequest("a0", {"codes": codes[:4], "stream_id": "a", "is_last": False}))
    engine.add_request(StageRequest("b0", {"codes": codes[:4], "stream_id": "b", "is_last": False}))
    engine.step()
    assert len(engine.decoder.live) == 2
    engine.add_request(StageRequest("a1", {"codes": codes[4:], "stream_id": "a", "is_last": True}))
    engine.add_request(StageRequest("b1", {"codes": codes[4:], "stream_id": "b", "is_last": False}))
    engine.abort_request("b1")  # aborting a part ends its stream
    assert len(engine.decoder.live) == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine.decoder.live and not engine._streams
    engine.close()


def test_aborting_a_request_between_codec_chunks_frees_its_stream(tts_path):
    """The talker is aborted after a codec part finished and before the next was sent: no part of the codec
    stream is in flight, and the stream (with its decoder state) must still go."""
    from omnistage import AsyncOmni
    from omnistage.ar import SamplingParams
    from omnistage.models.qwen3_tts import Code2WavParams

    params = {"talker": SamplingParams(temperature=0, max_tokens=200, min_tokens=200),
              "codec": Code2WavParams(first_chunk_frames=1, chunk_frames=100)}

    async def abort_after_the_first_chunk() -> None:
        async with AsyncOmni(tts_path) as omni:
            async for out in omni.generate({"prompt": "Hello there.", "voice": "vivian"}, params, request_id="r"):
                if out.audio_chunk is not None and not out.finished:
                    await omni.abort("r")
                last = out
            assert last.finish_reason == "abort"
            codec = omni.orchestrator.handles[1].endpoint.server.engine
            deadline = time.monotonic() + 5
            while (codec._streams or codec.decoder.live) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # the orchestrator thread delivers the abort to the codec stage
            assert not codec._streams and not codec.decoder.live

    asyncio.run(abort_after_the_first_chunk())


class _AudioRateOps(TorchDispatchMode):
    """The names of the ops dispatched while active that make a new tensor of at least `min_numel` elements."""

    def __init__(self, min_numel: int) -> None:
        super().__init__()
        self.min_numel, self.made = min_numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if torch.is_tensor(out) and out.numel() >= self.min_numel and not name.endswith("_") \
                and out.untyped_storage().data_ptr() not in {a.untyped_storage().data_ptr() for a in args
                                                               if torch.is_tensor(a)}:
            self.made.append(name)
        return out


def test_a_pass_makes_no_audio_rate_tensors_per_stream(tts_path):
    """Streams decoded together share every audio-rate tensor: the convolutions' carried state is cut from
    the batch (no row copied per stream), and the activations run in place on one new tensor each."""
    dec = _tts(tts_path)
    g = torch.Generator().manual_seed(2)
    made = {}
    for n in (1, 2, 8):
        codes = torch.randint(0, dec.codebook_size, (n, 12, dec.num_quantizers), generator=g)
        states = [dec.open_stream() for _ in range(n)]
        dec.decode(list(codes[:, :5]), states)  # first chunks (their left trims), then a carried one
        with torch.inference_mode(), _AudioRateOps(2 * n * dec.upsample) as ops:  # two frames of samples a row
            dec.decode(list(codes[:, 5:]), states)
        made[n] = ops.made
    assert made[2] == made[1] and made[8] == made[1]
    assert "sin" not in made[1] and "pow" not in made[1]  # SnakeBeta's sine and square, in place
