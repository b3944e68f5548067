"""Channel round trips: what goes in comes out equal, large payloads go through shared
memory and their segments are freed by the reader or by a sweep, and tensors always
arrive on the CPU, whatever their size."""

from __future__ import annotations

import os
import secrets

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.core.types import AudioPayload, StageOutput, TextPayload
from omnistage.runtime.channel import Channel, Packed, sweep_shm

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="lists segments in /dev/shm (Linux)")


@pytest.fixture
def shm():
    connector = Channel("shm", f"ostest{secrets.token_hex(3)}", threshold_bytes=1024)
    yield connector
    assert connector.sweep() == 0, "a segment outlived its message"


def segments(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def assert_same(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, Image.Image):
        assert (a.mode, a.size, a.info) == (b.mode, b.size, b.info) and a.tobytes() == b.tobytes()
        assert a.getpalette() == b.getpalette()
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif hasattr(a, "__dataclass_fields__"):
        assert_same(vars(a), vars(b))
    else:
        assert a == b


def rgb(size: int = 64) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8))


VALUES = {
    "float tensor": torch.randn(64, 32),
    "bf16 tensor": torch.randn(40, 40).to(torch.bfloat16),
    "int tensor": torch.arange(1000),
    "bool tensor": torch.rand(2000) > 0.5,
    "non-contiguous tensor": torch.randn(64, 64).t(),
    "numpy float32": np.random.default_rng(0).standard_normal(2000).astype(np.float32),
    "numpy uint8 frames": np.random.default_rng(0).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8),
    "numpy non-contiguous": np.arange(4000, dtype=np.int64).reshape(40, 100)[:, ::2],
    "rgb image": rgb(),
    "grey image": rgb().convert("L"),
    "palette image": rgb().convert("P"),
    "rgba image with info": Image.new("RGBA", (40, 40), (1, 2, 3, 4)),
    "bytes": os.urandom(5000),
    "nested dict": {"a": [torch.ones(300), {"b": np.zeros(500), "c": b"x" * 2000}], "d": "text", "e": None, "f": 1.5},
    "text payload": TextPayload([1, 2, 3], "hi", hidden_states=torch.randn(3, 128), extras={"e": torch.ones(64)}),
    "stage outputs": [StageOutput("r", AudioPayload(np.ones(24000, np.float32), 24000, True), False)],
}
VALUES["rgba image with info"].info["prompt"] = "a cat"


@pytest.mark.parametrize("name", VALUES)
def test_shm_round_trip(shm, name):
    value = VALUES[name]
    sent = shm.put(value)
    assert sent.segment is not None, "above the threshold: travels through shared memory"
    assert segments(shm.prefix) == [sent.segment]
    assert_same(shm.get(sent), value)
    assert segments(shm.prefix) == []  # the reader freed it


@pytest.mark.parametrize("name", ["bf16 tensor", "nested dict", "palette image", "stage outputs"])
def test_inline_transport_keeps_the_buffers_in_the_packed_form(name):
    channel = Channel("inline")
    sent = channel.put(VALUES[name])
    assert sent.segment is None and sent.ref is None
    assert_same(channel.get(sent), VALUES[name])


def test_small_payloads_travel_inline(shm):
    small = {"tokens": [1, 2, 3], "t": torch.ones(4)}
    sent = shm.put(small)
    assert sent.segment is None and segments(shm.prefix) == []
    assert_same(shm.get(sent), small)


def test_default_threshold_is_64_kib():
    channel = Channel("shm", f"ostest{secrets.token_hex(3)}")
    below = np.zeros(60 * 1024, np.uint8)
    above = np.zeros(64 * 1024, np.uint8)
    assert channel.put(below).segment is None
    sent = channel.put(above)
    assert sent.segment is not None
    assert_same(channel.get(sent), above)


def test_received_arrays_and_tensors_are_writable_copies(shm):
    out = shm.get(shm.put({"a": np.zeros(1000), "t": torch.zeros(1000)}))
    out["a"][0] = 1
    out["t"][0] = 1
    assert out["a"][0] == 1 and out["t"][0] == 1


def test_tensors_arrive_on_cpu_detached(shm):
    t = torch.ones(1000, requires_grad=True)
    out = shm.get(shm.put(t * 2))
    assert out.device.type == "cpu" and not out.requires_grad and torch.equal(out, torch.full((1000,), 2.0))


def test_sweep_frees_segments_nobody_read(shm):
    orphans = [shm.put(np.zeros(5000)) for _ in range(3)]
    assert len(segments(shm.prefix)) == 3
    assert sweep_shm(shm.prefix) == 3
    assert segments(shm.prefix) == []
    with pytest.raises(FileNotFoundError):
        shm.get(orphans[0])


def test_unknown_transport_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown transport 'smh'; valid: inline, shm, ray"):
        Channel("smh", "p")


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it lives on CUDA, and records where it is asked to move."""

    moves: list = []

    @property
    def device(self):
        return torch.device("cuda", 0)

    def to(self, *args, **kwargs):
        FakeCudaTensor.moves.append(args)
        return torch.Tensor._make_subclass(torch.Tensor, self.as_subclass(torch.Tensor).detach().clone())


@pytest.mark.parametrize("transport, size", [("inline", 4), ("shm", 4), ("shm", 100_000)],
                         ids=["inline", "shm-small", "shm-large"])
def test_cuda_tensors_cross_on_the_cpu_whatever_their_size(transport, size):
    FakeCudaTensor.moves = []
    channel = Channel(transport, f"ostest{secrets.token_hex(3)}", threshold_bytes=1024)
    values = torch.arange(size, dtype=torch.float32)
    cuda = torch.Tensor._make_subclass(FakeCudaTensor, values)
    assert cuda.device.type == "cuda"
    sent = channel.put(StageOutput("r", TextPayload([1], hidden_states=cuda), False))
    assert FakeCudaTensor.moves == [("cpu",)], "moved to the CPU once, before it crossed"
    out = channel.get(sent).payload.hidden_states
    assert type(out) is torch.Tensor and out.device.type == "cpu" and torch.equal(out, values)
