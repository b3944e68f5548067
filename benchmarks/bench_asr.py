"""Transcription real-time factor: Qwen3-ASR on omnistage's AR engine vs transformers' `generate`.

8 clips of 2 s of 16 kHz audio (`omnistage.testing.qwen3_asr_models.asr_clips`, equal lengths
so that transformers' batch pads nothing), the language detected by the model, 32 new tokens
each (greedy, min_tokens = max_tokens = 32, so every run does the same decoder work), on the
zoo's qwen3-asr (tiny), fp32 on CPU unless `--device` / `--dtype` say otherwise. Timed from the
waveform: the processor's log-mel features, the audio encoder and the decoder, in both.

- one at a time: each clip alone, 8 times (ours: `AREngine`, one request, stepped until done;
  transformers: `apply_transcription_request` + `generate` of one clip);
- 8 at once: ours, all 8 submitted together (continuous batching); transformers, one batched
  `generate` of the 8.

Real-time factor = seconds of compute / seconds of audio (lower is faster). Each run is
warmed up once, then timed `--repeats` times interleaved; the best run counts. Prints a
markdown table and writes it under "## Qwen3-ASR" in benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/bench_asr.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from common import ROOT, add_device_args, synchronize, torch_dtype, write_section

NUM_CLIPS, SECONDS, NEW_TOKENS = 8, 2.0, 32
NOTE = (
    "Ours admits each clip on its own (the processor's features and the audio encoder run once per request, "
    "at admission), where the batched `generate` encodes the 8 clips in one call; the decoder steps are "
    "batched in both. On a machine this loaded the ratios move by about 0.3 from run to run (an earlier run "
    "at load 22 gave 1.08x and 0.65x).")
"""What the numbers mean (written under the table; edit it when a rerun changes the picture)."""


def run_ours(engine, prompts, params) -> list[list[int]]:
    from omnistage.core.types import StageRequest

    for i, prompt in enumerate(prompts):
        engine.add_request(StageRequest(f"r{i}", prompt, params))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.payload.token_ids
    return [done[f"r{i}"] for i in range(len(prompts))]


def run_generate(processor, model, clips, device) -> list[list[int]]:
    inputs = processor.apply_transcription_request(audio=clips).to(device)
    inputs["input_features"] = inputs["input_features"].to(model.dtype)
    out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[:, inputs["input_ids"].shape[1]:].tolist()


def bench(repeats: int, device: str, dtype: str) -> dict:
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    from omnistage.ar.engine import AREngine
    from omnistage.ar.sampling_params import SamplingParams
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.models.qwen3_asr import QWEN3_ASR
    from omnistage.models.qwen3_asr.transcription import transcription_prompt
    from omnistage.testing import ensure
    from omnistage.testing.qwen3_asr_models import QWEN3_ASR_SAMPLE_RATE, asr_clips

    path = str(ensure("qwen3-asr", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    clips = asr_clips((SECONDS,) * NUM_CLIPS)
    prompts = [transcription_prompt(clip, QWEN3_ASR_SAMPLE_RATE) for clip in clips]
    processor = AutoProcessor.from_pretrained(path)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(path, dtype=torch_dtype(dtype),
                                                             attn_implementation="sdpa").to(device).eval()
    engine = AREngine(path, QWEN3_ASR.stages[0],
                      StageDeployConfig(max_num_seqs=NUM_CLIPS, dtype=dtype, devices=(device,)))
    params = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0)
    runs = {
        "ours, one at a time": lambda: [run_ours(engine, [p], params)[0] for p in prompts],
        "generate, one at a time": lambda: [run_generate(processor, model, [c], device)[0] for c in clips],
        "ours, 8 at once": lambda: run_ours(engine, prompts, params),
        "generate, 8 at once": lambda: run_generate(processor, model, clips, device),
    }
    best = {name: float("inf") for name in runs}
    outputs = {}
    with torch.inference_mode():
        for name, fn in runs.items():  # warm-up
            outputs[name] = fn()
        for _ in range(repeats):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                fn()
                synchronize(device)
                best[name] = min(best[name], time.perf_counter() - t0)
    engine.close()
    same = sum(a == b for a, b in zip(outputs["ours, 8 at once"], outputs["generate, one at a time"]))
    return {"secs": best, "same": same, "device": device, "dtype": dtype, "loadavg": os.getloadavg()}


def table(r: dict, repeats: int) -> str:
    audio = NUM_CLIPS * SECONDS
    where = "fp32, CPU" if (r["device"], r["dtype"]) == ("cpu", "float32") else f"{r['dtype']}, {r['device']}"
    s = r["secs"]
    lines = [
        f"{NUM_CLIPS} clips x {SECONDS:g} s of 16 kHz audio ({audio:g} s), language detected, {NEW_TOKENS} new tokens "
        f"each (greedy, min_tokens = max_tokens), zoo qwen3-asr tiny, {where}, {torch.get_num_threads()} torch "
        f"thread(s), best of {repeats} timed runs; timed from the waveform (features, encoder, decoder). Real-time "
        f"factor = compute seconds / audio seconds. Load average at the end: "
        f"{' '.join(f'{x:.2f}' for x in r['loadavg'])} (a shared machine).",
        "",
        "| run | seconds | real-time factor | generate / ours (same run shape) |",
        "| --- | --- | --- | --- |",
    ]
    for name in s:
        peer = name.replace("ours", "generate") if name.startswith("ours") else None
        ratio = f"{s[peer] / s[name]:.2f}x" if peer else ""
        lines.append(f"| {name} | {s[name]:.3f} | {s[name] / audio:.4f} | {ratio} |")
    lines += ["", f"Same greedy tokens as `generate` one clip at a time: {r['same']}/{NUM_CLIPS}.", "", NOTE]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: on a shared machine, OpenMP spin-waits dominate a tiny model)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    add_device_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    r = bench(args.repeats, args.device, args.dtype)
    body = table(r, args.repeats)
    print(body)
    if not args.no_write:
        write_section("Qwen3-ASR", "benchmarks/bench_asr.py", body)


if __name__ == "__main__":
    main()
