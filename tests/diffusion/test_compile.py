"""`compile: true`: regional torch.compile of the repeated transformer blocks, on Z-Image.
Graphs are counted with torch's CompileCounter backend (no inductor here: CPU compile takes
minutes on a shared machine; benchmarks/bench_memory.py measures inductor's compile time and
steady-state speed). Step mode's changing batch sizes reuse the graphs after one recompile."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.diffusion.accel import compile as regional_compile

from accel_common import call_kwargs, load, run
from parity import request_for


@pytest.fixture(scope="module")
def path(zoo):
    return zoo("z-image")


def requests(n: int, **overrides):
    return [request_for(call_kwargs("z-image", **overrides), seed=i, request_id=f"r{i}") for i in range(n)]


def test_compile_wraps_only_the_repeated_blocks(path):
    # torch.compile is lazy: loading wraps the blocks, nothing compiles until they run.
    pipeline = load("z-image", path, compile=True)
    assert pipeline.accelerations == ["compile"]
    blocks = regional_compile.compiled_blocks(pipeline)
    assert blocks and all(b.startswith("transformer.") for b in blocks)
    assert {type(m).__name__ for n, m in pipeline.transformer.named_modules()
            if f"transformer.{n}" in blocks} == {"ZImageTransformerBlock"}
    assert len(blocks) == sum(type(m).__name__ == "ZImageTransformerBlock" for m in pipeline.transformer.modules())


def test_batch_sizes_of_step_mode_reuse_the_graphs(path):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    plain = load("z-image", path)
    ours = load("z-image", path)
    counter = CompileCounter()
    regional_compile.apply(ours, regional_compile.CompileConfig(backend=counter))
    with torch.inference_mode():
        got = ours.decode_arrays(ours.denoise(requests(1)))
        after_first = counter.frame_count
        for n in (2, 3, 1, 4):  # the batch sizes step mode goes through
            ours.denoise(requests(n))
        after_sizes = counter.frame_count
        for n in (3, 2, 4):
            ours.denoise(requests(n))
    assert after_first >= 1
    assert after_sizes - after_first <= after_first  # one dynamic recompile per graph at most
    assert counter.frame_count == after_sizes  # steady state: no more recompiles
    np.testing.assert_allclose(got[0], run(plain, "z-image", seed=0), atol=1e-5)


def test_family_without_repeated_blocks_is_refused(zoo):
    with pytest.raises(ValueError, match="compile=True: StableDiffusion3Pipeline cannot take it: its transformer declares no repeated blocks"):
        load("sd3", zoo("sd3"), compile=True)
