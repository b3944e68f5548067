"""`compile: true` on an AR stage on CUDA: decode steps replayed from captured CUDA graphs give
the eager engine's greedy tokens (fp32, same device) alone, in a ragged batch of three (padded
to four), joining mid-decode, after the batch shrinks and across a key-length bucket; and the
graphs really ran. The zoo's tiny qwen2-llm. (The static path without capture: tests/ar/
test_ar_static_decode.py, on CPU.)"""

from __future__ import annotations

import time

import pytest
import torch
from ar_helpers import PROMPTS, final, run

from omnistage.ar.sampling_params import SamplingParams
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.types import StageRequest
from omnistage.engine.factory import create_engine

pytestmark = pytest.mark.gpu

MAX_NEW = 16
LLM = StageSpec(id=0, name="llm", kind="ar", output="text", final_output=True)
CONFIG = dict(devices=("cuda:0",), dtype="float32", max_num_seqs=4, max_model_len=512)


def greedy(n: int = MAX_NEW, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def llm_path(zoo) -> str:
    return str(zoo("qwen2-llm", size="tiny"))


@pytest.fixture(scope="module")
def eager(llm_path):
    engine = create_engine(llm_path, LLM, StageDeployConfig(**CONFIG))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def graphs(llm_path, report):
    start = time.perf_counter()
    engine = create_engine(llm_path, LLM, StageDeployConfig(compile=True, **CONFIG))
    report("ar_cuda_graphs_startup_s", value=round(time.perf_counter() - start, 3),
           graphs=len(engine.runner.static_decode.graphs))
    yield engine
    engine.close()


def tokens(engine, requests, on_step=None) -> dict[str, list[int]]:
    outputs = run(engine, requests, on_step=on_step)
    return {rid: final(outputs, rid).token_ids for rid in outputs}


def replayed(engine, requests, on_step=None) -> tuple[dict[str, list[int]], dict[tuple[int, int], int]]:
    """The tokens, and the graph replays the run took by (padded batch size, key length)."""
    static = engine.runner.static_decode
    before, replays = dict(static.steps_by_shape), static.num_replays
    got = tokens(engine, requests, on_step)
    shapes = {s: n - before.get(s, 0) for s, n in static.steps_by_shape.items() if n > before.get(s, 0)}
    assert static.num_replays - replays == sum(shapes.values())  # every static step was a replay
    return got, shapes


def test_one_graph_per_batch_size_and_key_length(graphs):
    assert set(graphs.runner.static_decode.graphs) == {(b, k) for b in (1, 2, 4) for k in (256, 512)}


def test_alone(eager, graphs):
    for i, p in enumerate(PROMPTS):
        requests = [StageRequest(f"a{i}", p, greedy())]
        got, shapes = replayed(graphs, requests)
        assert got == tokens(eager, requests), p
        assert shapes == {(1, 256): MAX_NEW - 1}


def test_ragged_batch_of_three(eager, graphs, report):
    requests = [StageRequest(f"b{i}", p, greedy(logprobs=1)) for i, p in enumerate(PROMPTS[1:])]
    before = graphs.runner.static_decode.num_replays
    got, want = run(graphs, requests), run(eager, requests)
    assert graphs.runner.static_decode.num_replays - before == MAX_NEW - 1
    worst = 0.0
    for r in requests:
        ours, theirs = final(got, r.request_id), final(want, r.request_id)
        assert ours.token_ids == theirs.token_ids
        worst = max(worst, max(abs(a.logprob - b.logprob) for a, b in zip(ours.logprobs, theirs.logprobs)))
    report("ar_cuda_graphs_logprob_max_abs_diff", value=worst)
    assert worst < 1e-4


def test_one_joins_mid_decode(eager, graphs):
    def join(step, eng):
        if step == 5:
            eng.add_request(StageRequest("late", PROMPTS[3], greedy()))

    requests = [StageRequest(f"j{i}", p, greedy()) for i, p in enumerate(PROMPTS[:2])]
    got, shapes = replayed(graphs, requests, on_step=join)
    assert got == tokens(eager, requests, on_step=join) and len(got) == 3
    assert shapes.get((2, 256)) and shapes.get((4, 256))


def test_batch_shrinks_as_rows_finish(eager, graphs):
    requests = [StageRequest(f"s{i}", p, greedy(n)) for i, (p, n) in enumerate(zip(PROMPTS[1:], (4, 9, 16)))]
    got, shapes = replayed(graphs, requests)
    assert got == tokens(eager, requests)
    assert shapes == {(4, 256): 3, (2, 256): 5, (1, 256): 7}


def test_context_crossing_a_key_length_bucket(eager, graphs):
    prompt = {"prompt_token_ids": [(37 * i) % 1000 + 3 for i in range(250)]}
    requests = [StageRequest("long", prompt, greedy()), StageRequest("short", PROMPTS[0], greedy())]
    got, shapes = replayed(graphs, requests)
    assert got == tokens(eager, requests)
    assert set(shapes) == {(2, 256), (2, 512)}


def test_decode_speed(eager, graphs, report):
    """Not a goal, a number: 4 x 64 greedy tokens, eager vs graphs (the benchmark is
    benchmarks/bench_ar_cuda_graphs.py)."""
    def requests(tag: str) -> list[StageRequest]:
        return [StageRequest(f"{tag}{i}", p, greedy(64)) for i, p in enumerate(PROMPTS)]

    seconds = {}
    for name, engine in (("eager", eager), ("graphs", graphs)):
        tokens(engine, requests(f"warm-{name}"))
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens(engine, requests(name))
        torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - start
    report("ar_cuda_graphs_decode_tok_s", eager=round(4 * 64 / seconds["eager"]),
           graphs=round(4 * 64 / seconds["graphs"]), ratio=round(seconds["eager"] / seconds["graphs"], 2))
