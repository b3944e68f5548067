"""Memory and kernel options on CUDA (issue 15): offload placement and peak memory, int8 and
fp8 weight-only quantization (PSNR, weight bytes), int8 and fp8 dynamic quantization (activations
too: PSNR, speed against the plain run), on the zoo's Z-Image (small: large enough
that the weights, not the activations, decide the peak). Numbers go to the GPU report."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from omnistage.diffusion.accel.quantization import weight_bytes

from accel_common import load, psnr, run

pytestmark = pytest.mark.gpu

NAME = "z-image"


@pytest.fixture(scope="module")
def path(zoo):
    return zoo(NAME, size="small")


def peak_run(pipeline) -> tuple[np.ndarray, float]:
    """The output and the peak CUDA memory (MiB) of one request, weights included."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = run(pipeline, NAME, height=256, width=256)
    torch.cuda.synchronize()
    return out, torch.cuda.max_memory_allocated() / 2**20


@pytest.fixture(scope="module")
def plain(path):
    pipeline = load(NAME, path, devices=["cuda"], dtype="float32")
    out, peak = peak_run(pipeline)
    yield out, peak, weight_bytes(pipeline.transformer)
    del pipeline
    torch.cuda.empty_cache()


@pytest.mark.parametrize("fields", [dict(offload="model"), dict(offload="layerwise"),
                                    dict(offload="layerwise", offload_blocks_per_group=2)])
def test_offload_is_exact_and_lowers_the_peak(path, plain, report, fields):
    want, plain_peak, _ = plain
    torch.cuda.empty_cache()
    pipeline = load(NAME, path, devices=["cuda"], dtype="float32", **fields)
    assert all(p.device.type == "cpu" for p in pipeline.transformer.parameters())  # waiting on the CPU
    got, peak = peak_run(pipeline)
    report(f"offload {fields}", peak_mib=peak, plain_peak_mib=plain_peak, ratio=peak / plain_peak,
           max_abs_diff=float(np.abs(got - want).max()))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert peak < plain_peak


@pytest.mark.parametrize("method, min_psnr", [("int8", 40.0), ("fp8", 30.0)])
def test_quantization_on_cuda(path, plain, report, method, min_psnr):
    want, plain_peak, plain_bytes = plain
    pipeline = load(NAME, path, devices=["cuda"], dtype="float32", quantization=method)
    got, peak = peak_run(pipeline)
    ratio = weight_bytes(pipeline.transformer) / plain_bytes
    quality = psnr(got, want)
    report(f"quantization {method}", weight_bytes_ratio=ratio, psnr_db=quality, peak_mib=peak,
           plain_peak_mib=plain_peak)
    assert ratio <= 0.3 and quality >= min_psnr


@pytest.mark.parametrize("method, min_psnr", [("int8_dynamic", 30.0), ("fp8_dynamic", 25.0)])
def test_dynamic_quantization_on_cuda(path, report, method, min_psnr):
    """Activations rounded per token at run time (int8 GEMM / torch._scaled_mm; fp8 needs 8.9+),
    against the plain bf16 run: PSNR and speed."""
    if method == "fp8_dynamic" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8_dynamic needs CUDA compute capability 8.9+")
    plain_pipeline = load(NAME, path, devices=["cuda"], dtype="bfloat16")
    pipeline = load(NAME, path, devices=["cuda"], dtype="bfloat16", quantization=method)
    linear = next(m for m in pipeline.transformer.modules() if isinstance(m, torch.nn.Linear))
    assert linear.weight.act_quant_kwargs is not None  # the activations are quantized too
    seconds, images = {}, {}
    for label, p in (("plain", plain_pipeline), (method, pipeline)):
        run(p, NAME, height=256, width=256)  # warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        images[label] = run(p, NAME, height=256, width=256)
        torch.cuda.synchronize()
        seconds[label] = time.perf_counter() - start
    quality = psnr(images[method], images["plain"])
    report(f"quantization {method}", psnr_db_vs_bf16=quality, speed_vs_bf16=seconds["plain"] / seconds[method])
    assert quality >= min_psnr
