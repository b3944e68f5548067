"""GenerationEngine scheduling and chunking, on a tiny stateful fake decoder (no weights).

The fake's audio for frame f of a stream is [f, position of f in its stream], two samples
per frame, so the output shows both which frames were decoded and that stream state
carried across chunks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import Engine, StageRequest
from omnistage.generation.decoder import Decoder, register_decoder
from omnistage.generation.engine import GenerationEngine


class CountingDecoder(Decoder):
    sample_rate = 2
    chunk_frames = 3
    max_frames = 50

    def __init__(self):
        self.passes: list[int] = []  # rows per decoder pass
        self.open = 0

    @classmethod
    def load(cls, model_path, stage, device, dtype, max_streams):
        return cls()

    def parse(self, codes):
        t = torch.as_tensor(codes)
        if t.ndim != 1:
            raise ValueError(f"codes must be 1-D, got shape {list(t.shape)}")
        return t.float()

    def open_stream(self):
        self.open += 1
        return {"pos": 0}

    def close_stream(self, state):
        self.open -= 1

    def decode(self, codes, states):
        self.passes.append(len(codes))
        out = []
        for c, s in zip(codes, states):
            pos = np.arange(s["pos"], s["pos"] + c.shape[0], dtype=np.float32)
            s["pos"] += c.shape[0]
            out.append(np.stack([c.numpy(), pos], axis=1).reshape(-1))
        return out


register_decoder("tests.counting", CountingDecoder)
STAGE = StageSpec(id=0, name="vocoder", kind="generation", output="audio", model="tests.counting")


def expected(frames, start=0):
    frames = np.asarray(frames, dtype=np.float32)
    return np.stack([frames, np.arange(start, start + len(frames), dtype=np.float32)], axis=1).reshape(-1)


def make(max_num_seqs=4, **kw) -> GenerationEngine:
    return GenerationEngine("unused", STAGE, StageDeployConfig(max_num_seqs=max_num_seqs), **kw)


def drain(engine, on_step=None):
    outputs, i = {}, 0
    while True:
        if on_step:
            on_step(i, engine)
        if not engine.has_unfinished_requests():
            return outputs
        for o in engine.step():
            outputs.setdefault(o.request_id, []).append(o)
        i += 1
        assert i < 1000


def test_whole_requests_stream_out_in_chunks_batched():
    eng = make()
    assert isinstance(eng, Engine) and eng.is_healthy()
    eng.add_request(StageRequest("a", list(range(7))))
    eng.add_request(StageRequest("b", {"codes": [9, 8]}))
    outs = drain(eng)
    a = outs["a"]
    assert [o.payload.is_chunk for o in a] == [True, True, False] and [o.finished for o in a] == [False, False, True]
    np.testing.assert_array_equal(np.concatenate([o.payload.audio for o in a[:2]]), expected(range(6)))
    np.testing.assert_array_equal(a[-1].payload.audio, expected(range(7)))  # the final output is the whole
    np.testing.assert_array_equal(outs["b"][-1].payload.audio, expected([9, 8]))
    assert len(outs["b"]) == 1 and outs["b"][0].metrics["num_frames"] == 2
    assert eng.decoder.passes == [2, 1, 1]  # a and b shared the first pass
    assert eng.decoder.open == 0


def test_add_chunk_feeds_an_open_request():
    eng = make()
    eng.add_request(StageRequest("s", {"codes": [1, 2], "is_last": False}))

    def feed(step, e):
        if step == 2:
            e.add_chunk("s", [3, 4, 5, 6])
        if step == 4:
            e.add_chunk("s", [], is_last=True)

    outs = drain(eng, feed)["s"]
    assert outs[-1].finished and not outs[-1].payload.is_chunk
    np.testing.assert_array_equal(outs[-1].payload.audio, expected([1, 2, 3, 4, 5, 6]))
    np.testing.assert_array_equal(np.concatenate([o.payload.audio for o in outs]),
                                  np.concatenate([expected([1, 2, 3, 4, 5, 6])] * 2))
    with pytest.raises(ValueError, match="unknown request"):
        eng.add_chunk("s", [1])


def test_parts_of_a_stream_share_the_decoder_state():
    eng = make(max_num_seqs=2, chunk_frames=None)
    eng.add_request(StageRequest("r#0", {"codes": [5, 6], "stream_id": "r", "is_last": False}))
    outs = drain(eng)
    np.testing.assert_array_equal(outs["r#0"][-1].payload.audio, expected([5, 6]))
    assert eng.decoder.open == 1  # the stream waits for its next part
    eng.add_request(StageRequest("r#1", {"codes": [7], "stream_id": "r", "is_last": False}))
    eng.add_request(StageRequest("r#2", {"codes": [8, 9], "stream_id": "r", "is_last": True}))
    outs = drain(eng)
    np.testing.assert_array_equal(outs["r#1"][-1].payload.audio, expected([7], start=2))
    np.testing.assert_array_equal(outs["r#2"][-1].payload.audio, expected([8, 9], start=3))
    assert all(len(v) == 1 and v[0].finished for v in outs.values())
    assert eng.decoder.open == 0


def test_at_most_max_num_seqs_streams_per_pass():
    eng = make(max_num_seqs=2)
    for i in range(5):
        eng.add_request(StageRequest(f"r{i}", [i] * 4))
    outs = drain(eng)
    assert max(eng.decoder.passes) == 2 and sum(eng.decoder.passes) == 10  # 5 requests x 2 chunks
    for i in range(5):
        np.testing.assert_array_equal(outs[f"r{i}"][-1].payload.audio, expected([i] * 4))


def test_a_newcomer_is_decoded_before_a_stream_far_ahead():
    """One seat (max_num_seqs=1): stream "old" has 3 s of audio out (a frame is 1 s here) and its next
    part waiting; "new" arrives after it. Earliest deadline first, new's first chunk goes before
    old's next one, and both stay open (more streams open than a pass decodes)."""
    eng = make(max_num_seqs=1)
    eng.add_request(StageRequest("old#0", {"codes": [1, 2, 3], "stream_id": "old", "is_last": False}))
    eng.step()
    eng.add_request(StageRequest("old#1", {"codes": [4, 5, 6], "stream_id": "old", "is_last": True}))
    eng.add_request(StageRequest("new", [7, 8, 9, 10]))
    assert [o.request_id for o in eng.step()] == ["new"]
    assert eng.decoder.open == 2
    assert [o.request_id for o in eng.step()] == ["old#1"]  # new has 3 s out too, got later: old is due first


def test_abort_frees_the_stream_without_output():
    eng = make()
    eng.add_request(StageRequest("a", list(range(9))))
    eng.add_request(StageRequest("b", list(range(2))))
    eng.step()
    eng.abort_request("a")
    eng.abort_request("unknown")
    outs = drain(eng)
    assert "a" not in outs and eng.decoder.open == 0 and not eng.has_unfinished_requests()


def test_a_stream_the_decoder_cannot_open_fails_alone():
    eng = make()
    eng.add_request(StageRequest("bad", {"codes": [1], "options": {"voice": "x"}}))  # CountingDecoder takes none
    eng.add_request(StageRequest("good", [2]))
    outs = drain(eng)
    assert outs["bad"][-1].finished and "TypeError" in outs["bad"][-1].error
    np.testing.assert_array_equal(outs["good"][-1].payload.audio, expected([2]))
    assert eng.decoder.open == 0


def test_bad_inputs_are_rejected_at_add():
    eng = make()
    with pytest.raises(ValueError, match="1-D"):
        eng.add_request(StageRequest("x", [[1, 2]]))
    with pytest.raises(ValueError, match="audio"):
        eng.add_request(StageRequest("x", {"codes": [1], "audio": 1}))
    with pytest.raises(ValueError, match="max_frames=50"):
        eng.add_request(StageRequest("x", list(range(51))))
    eng.add_request(StageRequest("x", [1]))
    with pytest.raises(ValueError, match="already running"):
        eng.add_request(StageRequest("x", [1]))
    with pytest.raises(ValueError, match="last chunk"):
        eng.add_chunk("x", [2])
    with pytest.raises(ValueError, match="StageSpec.model"):
        GenerationEngine("unused", None)
