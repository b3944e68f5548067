"""What the Responses route adds over chat completions for the same request.

One `omnistage serve` of the zoo's small LLM (qwen2-llm) in a subprocess; the same prompts
go to `POST /v1/chat/completions` and `POST /v1/responses` (the default `store: true`, so
storing the response is counted), alternating, one request at a time, whole and streamed.
Both ask for the same number of tokens (`ignore_eos`, a fixed seed), so both runs do the
same engine work; the median latency per route counts. Goal: Responses within 5% of chat.

    .venv/bin/python benchmarks/bench_responses.py [--size small] [--repeats 9] [--tokens 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import httpx

from bench_http import start_server
from common import ROOT, write_section

PROMPTS = ["Write a haiku about the sea.", "List three uses of copper.", "Explain a prefix cache in one line."]


def timed(client: httpx.Client, path: str, body: dict, stream: bool) -> float:
    t0 = time.perf_counter()
    if stream:
        with client.stream("POST", path, json={**body, "stream": True}) as resp:
            resp.raise_for_status()
            for _ in resp.iter_lines():
                pass
    else:
        client.post(path, json=body).raise_for_status()
    return time.perf_counter() - t0


def bench(size: str, repeats: int, tokens: int) -> list[dict]:
    from omnistage.testing import ensure

    path = str(ensure("qwen2-llm", size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    proc, url = start_server(path)
    sampling = {"temperature": 1.0, "seed": 0, "ignore_eos": True}
    rows = []
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            # The same engine work under both routes, or the ratio means nothing.
            chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPTS[0]}],
                                                             "max_tokens": tokens, **sampling}).json()
            answer = client.post("/v1/responses", json={"input": PROMPTS[0], "max_output_tokens": tokens,
                                                        **sampling}).json()
            assert answer["output_text"] == chat["choices"][0]["message"]["content"], (answer, chat)
            assert answer["usage"]["output_tokens"] == chat["usage"]["completion_tokens"] == tokens
            for stream in (False, True):
                times: dict[str, list[float]] = {"chat": [], "responses": []}
                for i in range(repeats + 1):
                    prompt = PROMPTS[i % len(PROMPTS)]
                    bodies = {"chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                                "max_tokens": tokens, **sampling}),
                              "responses": ("/v1/responses", {"input": prompt, "max_output_tokens": tokens,
                                                              **sampling})}
                    # Each goes first every other time, so whatever the first of a pair pays is shared.
                    for route in (("chat", "responses") if i % 2 else ("responses", "chat")):
                        seconds = timed(client, *bodies[route], stream)
                        if i:  # the first pair warms up
                            times[route].append(seconds)
                chat_s, responses_s = statistics.median(times["chat"]), statistics.median(times["responses"])
                rows.append({"mode": "streamed" if stream else "whole", "chat_s": chat_s, "responses_s": responses_s,
                             "ratio": responses_s / chat_s})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


def table(rows: list[dict], size: str, tokens: int, repeats: int) -> str:
    lines = [f"qwen2-llm ({size}), {tokens} tokens per answer, median of {repeats}, load average "
             f"{os.getloadavg()[0]:.2f} at the end.", "",
             "| answer | chat completions (s) | responses (s) | responses / chat | goal |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['chat_s']:.4f} | {r['responses_s']:.4f} | {r['ratio']:.3f}x | <= 1.05x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    body = table(bench(args.size, args.repeats, args.tokens), args.size, args.tokens, args.repeats) + (
        "\n\nThe same engine request under both routes (Responses is served by the chat path); "
        "what differs is the body's translation, the response object and its events, and the "
        "stored response (in memory).")
    print(body)
    if not args.no_write:
        write_section("Responses API overhead", "benchmarks/bench_responses.py", body)


if __name__ == "__main__":
    main()
