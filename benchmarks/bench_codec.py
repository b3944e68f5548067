"""Qwen3-TTS codec (the 12 Hz speech tokenizer's decoder, Qwen3-Omni's code2wav on top) per streamed chunk.

Two measurements on the zoo's tiny Qwen3-TTS checkpoint, in process:

1. Cost of one 25-frame chunk against the frames the stream already decoded (its left
   context). Before: what the codec ran per chunk until the state was carried, a one-shot
   pass over the last `context` frames + the chunk (its cost grows with the context).
   After: `Qwen3TTSCodec.decode` of the chunk alone, the stream's state carried from the
   context decoded before (goal: flat).
2. Eight streams' 25-frame chunks (each after 25 frames of its stream): one batched pass
   against one pass per stream; and chunks of mixed lengths (5, 9 and 25 frames): one pass
   padded to the longest, one pass per length (what `Code2Wav.decode` does), one per stream.

Times are this process's CPU time (user + system, `time.process_time`), median of `--repeats`:
on a shared, loaded machine wall time mostly measures the other processes. The load average
is printed beside the numbers.

    .venv/bin/python benchmarks/bench_codec.py [--threads 1] [--repeats 7] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import ROOT, write_section

CHUNK = 25
CONTEXTS = (0, 25, 50, 100, 200)
STREAMS = 8
MIXED = (5, 25, 25, 25, 25, 9, 25, 25)  # frames of 8 streams' chunks at one step (chunks of 5, then 25; a last 9)


def _loadavg() -> str:
    return open("/proc/loadavg").read().split()[0]


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--repeats", type=int, default=7, help="timings per point; the median counts")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    from omnistage.models.qwen3_tts.codec import Qwen3TTSCodec
    from omnistage.testing import ensure

    torch.set_num_threads(args.threads)
    path = str(ensure("qwen3-tts-custom-voice", cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    codec = Qwen3TTSCodec.load(path, None, torch.device("cpu"), torch.float32, STREAMS)
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, codec.codebook_size, (max(CONTEXTS) + CHUNK, codec.num_quantizers), generator=g)

    def carried(context: int):
        """A stream that decoded `context` frames; decoding the chunk after them."""
        def run():
            state = codec.open_stream()
            if context:
                codec.decode([codes[:context]], [state])
            start = time.process_time()
            codec.decode([codes[context:context + CHUNK]], [state])
            codec.close_stream(state)
            return time.process_time() - start
        return run

    rows, load = [], []
    for context in CONTEXTS:
        window = codes[:context + CHUNK].T[None]
        with torch.inference_mode():
            codec.model(window)  # warm
            before = _median_time(lambda: codec.model(window), args.repeats)
        run = carried(context)
        run()
        after = statistics.median(run() for _ in range(args.repeats))
        load.append(_loadavg())
        rows.append((context, before, after))
        print(f"context {context}: before {before * 1e3:.1f} ms, after {after * 1e3:.1f} ms (load {load[-1]})",
              flush=True)

    # Eight streams, each 25 frames in: one pass for all their next chunks vs one pass each.
    def streams():
        states = [codec.open_stream() for _ in range(STREAMS)]
        codec.decode([codes[:CHUNK]] * STREAMS, states)
        return states

    chunks = [codes[CHUNK + i:2 * CHUNK + i] for i in range(STREAMS)]

    def batched():
        states = streams()
        start = time.process_time()
        codec.decode(chunks, states)
        return time.process_time() - start

    def one_by_one():
        states = streams()
        start = time.process_time()
        for c, s in zip(chunks, states):
            codec.decode([c], [s])
        return time.process_time() - start

    batched(), one_by_one()
    together = statistics.median(batched() for _ in range(args.repeats))
    apart = statistics.median(one_by_one() for _ in range(args.repeats))
    batch_load = _loadavg()
    print(f"{STREAMS} streams: one batched pass {together * 1e3:.1f} ms, one pass each {apart * 1e3:.1f} ms "
          f"(load {batch_load})")

    # Chunks of mixed lengths (streams at their first, middle and last chunks): one pass padded to the
    # longest, against `decode`'s one pass per length, against one pass per stream.
    mixed = [codes[CHUNK:CHUNK + n] for n in MIXED]

    def timed(run_chunks):
        def run():
            states = streams()
            start = time.process_time()
            run_chunks(states)
            return time.process_time() - start
        run()
        return statistics.median(run() for _ in range(args.repeats))

    with torch.inference_mode():
        padded = timed(lambda states: codec._pass(mixed, states))
    by_length = timed(lambda states: codec.decode(mixed, states))
    per_stream = timed(lambda states: [codec.decode([c], [s]) for c, s in zip(mixed, states)])
    mixed_load = _loadavg()
    print(f"mixed chunks: padded {padded * 1e3:.1f} ms, by length {by_length * 1e3:.1f} ms, "
          f"per stream {per_stream * 1e3:.1f} ms (load {mixed_load})")

    table = "\n".join(f"| {c} | {b * 1e3:.1f} | {a * 1e3:.1f} | {b / a:.2f}x | {la} |"
                      for (c, b, a), la in zip(rows, load))
    flat = rows[-1][2] / rows[0][2]
    grow = rows[-1][1] / rows[0][1]
    body = f"""
Zoo qwen3-tts-custom-voice (tiny) codec, fp32, CPU, {args.threads} torch thread(s); process CPU time, median of
{args.repeats} (wall time on this shared machine mostly measures the other processes).
One {CHUNK}-frame chunk ({CHUNK / 12.5:.0f} s of audio) after `context` frames of its stream. Before = what the
codec ran per chunk until it carried its state: one pass over the context + the chunk (as the authors'
`chunked_decode`, whose default context is 25 frames). After = the chunk alone, the stream's state carried
(transformer keys within its window, convolution context, transposed-convolution tails). Load average (1 min)
beside each row: a shared machine.

| context frames | before (CPU ms) | after (CPU ms) | before / after | load average |
| --- | --- | --- | --- | --- |
{table}

- Cost per chunk from context 0 to {CONTEXTS[-1]}: before x{grow:.2f}, after x{flat:.2f} (goal: flat).
- {STREAMS} streams' next {CHUNK}-frame chunks: one batched pass {together * 1e3:.1f} ms, one pass per stream
  {apart * 1e3:.1f} ms ({apart / together:.2f}x; load average {batch_load}).
- {STREAMS} streams' chunks of {', '.join(map(str, MIXED))} frames: one pass padded to the longest
  {padded * 1e3:.1f} ms, one pass per length (`Code2Wav.decode`) {by_length * 1e3:.1f} ms, one pass per stream
  {per_stream * 1e3:.1f} ms (load average {mixed_load}). Padding a short chunk to a long one costs more than its own
  pass, so `decode` batches only equal lengths.
"""
    print(body)
    if not args.no_write:
        write_section("Codec: Qwen3-TTS streamed chunks", "benchmarks/bench_codec.py", body)


if __name__ == "__main__":
    main()
