"""Load: 200 image requests at concurrency 16 on a real server (tiny zoo Z-Image): none
lost, no 5xx, every image valid and of the asked size, and served in arrival order (no
request finishes before one sent clearly earlier). Prints p50/p99 latency and their ratio.

Fair admission's goal is p99 <= 1.5x p50 for identical requests. It is printed, not
asserted: with FIFO service and 16 clients every request waits for the 15 ahead of it,
so the ratio follows how steady the machine's speed is, which a shared CI machine does
not promise (here the steady-state latency drifted between 0.9 and 1.9 s while no
request was overtaken)."""

from __future__ import annotations

import base64
import io
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image
from remote_server import RemoteServer

pytestmark = pytest.mark.e2e

NUM_REQUESTS, CONCURRENCY = 200, 16
MARGIN_S = 0.2  # client threads send a little after they take the time
BODY = {"prompt": "a red square", "size": "32x32", "num_inference_steps": 2, "response_format": "b64_json"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def test_200_image_requests_at_concurrency_16(zoo, one_thread):
    # One intra-op thread: on a loaded 2-core machine two OpenMP threads made each request
    # 10x slower (1.09 s vs 0.10 s), and the test measures the server, not OpenMP. The server
    # runs in this process (nothing here signals it), so no interpreter starts for it.
    with RemoteServer(zoo("z-image"), in_process=True) as server:
        http = server.http(timeout=300)
        assert http.post("/v1/images/generations", json=BODY).status_code == 200  # warm up

        def one(i: int) -> tuple[int, float, tuple[int, int] | None, float, float]:
            start = time.perf_counter()
            resp = http.post("/v1/images/generations", json={**BODY, "seed": i})
            end = time.perf_counter()
            size = None
            if resp.status_code == 200:
                image = Image.open(io.BytesIO(base64.b64decode(resp.json()["data"][0]["b64_json"])))
                image.load()  # a truncated or corrupt PNG raises here
                size = image.size
            return resp.status_code, end - start, size, start, end

        start = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            results = list(pool.map(one, range(NUM_REQUESTS)))
        wall = time.perf_counter() - start
    statuses = [r[0] for r in results]
    assert len(results) == NUM_REQUESTS and statuses == [200] * NUM_REQUESTS, sorted(set(statuses))
    assert all(r[2] == (32, 32) for r in results)
    # Arrival order: a request sent MARGIN_S after another never finishes MARGIN_S before it.
    overtaken = [(a, b) for a in results for b in results if b[3] > a[3] + MARGIN_S and b[4] < a[4] - MARGIN_S]
    assert not overtaken, f"{len(overtaken)} requests finished before requests sent earlier"
    latencies = [r[1] for r in results]
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    print(f"\n[load] {NUM_REQUESTS} requests at concurrency {CONCURRENCY} in {wall:.1f} s: "
          f"p50 {p50:.3f} s, p99 {p99:.3f} s, p99/p50 {p99 / p50:.2f}, mean {statistics.mean(latencies):.3f} s")
