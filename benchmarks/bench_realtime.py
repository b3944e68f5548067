"""Realtime voice (WS /v1/realtime) against the same exchange as one chat completion.

One `omnistage serve` of the zoo's Qwen2.5-Omni in a subprocess (thinker capped at 8
tokens, talker at 32 codes, greedy, so every answer does the same engine work). A turn is
1 s of the synthetic voice then 0.6 s of silence (omnistage/testing/voice.py), streamed in
100 ms appends, one every 100 ms as a microphone sends them, to a fresh session with server
VAD (silence_duration_ms 200):

- turn latency: from the `input_audio_buffer.speech_stopped` event to the first
  `response.output_audio.delta`, with the turn prefilled while it is spoken (the default)
  and on a second server with `--no-realtime-prefill`; against each, the same audio sent as
  one streamed chat completion with audio out (`input_audio` wav, `modalities: ["text",
  "audio"]`) to the same server, from sending the request to the first audio chunk. Turns
  alternate with chat requests. Goal: realtime <= 0.5x of chat;
- barge-in: once the turn is all sent and the answer's audio comes, 1 s of voice is appended; from the
  `speech_started` event to `response.done` (cancelled), and the audio sent in between;
  with `--barge-in N` (N answers, that table only): from `speech_started` to the last audio
  byte the client received, and to the last audio the engine made for the answer (the
  server's `omnistage_audio_seconds_total`, polled every 10 ms from `speech_started` on),
  against one vocoder chunk's duration (the answer's median audio delta). Goal: <= one chunk;
- 8 sessions at once, one turn each: a stall is a gap between two audio deltas longer
  than the audio the client already had ahead of playback (its player would run dry).

    .venv/bin/python benchmarks/bench_realtime.py [--size tiny] [--turns 20] [--barge-in N] [--no-write]
"""

from __future__ import annotations

import argparse
import base64
import io
import itertools
import json
import os
import statistics
import threading
import time

import httpx
import numpy as np
import soundfile as sf
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from bench_http import start_server
from common import ROOT, write_section

OVERRIDES = {"0": {"default_sampling_params": {"max_tokens": 8, "temperature": 0, "ignore_eos": True}},
             "1": {"default_sampling_params": {"max_tokens": 32, "ignore_eos": True, "seed": 0}}}
BARGE_OVERRIDES = {**OVERRIDES, "1": {"default_sampling_params": {"max_tokens": 600, "ignore_eos": True, "seed": 0}}}
"""Answers long enough (600 talker codes) to be still speaking when the user's speech is heard."""


NOTE = (
    "First text: from the same start to the first transcript piece (the thinker's first token), so first "
    "audio minus first text is the part of the answer both routes share: the talker's first 24 codes (the "
    "first token2wav chunk, one 12-frame DiT block, waits for one more block of look-ahead) and token2wav's "
    "first window. The turn is prefilled while it is spoken: every half second of the turn is cut as a clip "
    "and warmed into the thinker's prefix cache before `speech_stopped`, so the answer computes only what "
    "follows the last full cached block. A realtime turn pays nothing the chat request does not: the commit, "
    "`response.created` and the engine request take about 1 ms after `speech_stopped` (timed by hand from "
    "the events), and the talker starts "
    "on the thinker's second token in both. On the tiny model the shared tail is most of either (the "
    "in-process profile above: the talker's 24 steps and token2wav's first window, DiT then BigVGAN). So "
    "realtime / chat cannot go below about tail / (tail + chat's own prefill) here, far above 0.5x, unless "
    "the first chunk shrinks, which on Qwen2.5-Omni changes the waveform: `Token2WavParams(first_right_context"
    "=0)` (section \"Qwen2.5-Omni\") is 12 talker steps and half a DiT window sooner at 0.22 relative RMS "
    "error on the first block. The goal needs a model whose prompt dominates the turn. The machine was shared "
    "with other jobs (see the load average). Barge-in is counted on the server's side (the answer is cancelled "
    "before `speech_started` is sent). **8 sessions at once stall** on 2 CPU cores.")
"""What the numbers mean (written under the table; edit it when a rerun changes the picture)."""
BARGE_NOTE = (
    "The session cancels the answer before it sends `speech_started` (the cancel closes the engine stream, "
    "which aborts the request), so the client receives no audio after it. The engine's side is read from "
    "its audio counter, polled every 10 ms: an answer's last chunk shows within one poll of when it was "
    "made. The barge-in speech is appended at once (1 s of voice); `speech_started` follows when the VAD "
    "has run over it. An answer that ended before that speech was sent or heard is not counted. The machine "
    "was shared with other jobs (see the load average): the VAD row's times move with it.")
"""What the barge-in numbers mean."""


_voices = itertools.count()


def fresh_voices() -> None:
    """Start the pitches over, for a new engine: silero-vad hears speech in the first 100 pitches (not
    in the 101st and 102nd), and one server of a 20-turn run hears about 70."""
    global _voices
    _voices = itertools.count()


def voice() -> np.ndarray:
    """1 s of speech then 0.6 s of silence at 24 kHz, in a pitch no request to this engine had before:
    an exchange sent twice would be answered from the prefix cache, prefill or not (blocks over a clip
    are keyed by its samples)."""
    from omnistage.testing.voice import synthetic_speech

    pitch = 110.0 + 0.25 * next(_voices)
    return np.concatenate([synthetic_speech(1.0, pitch=pitch), np.zeros(14400, np.float32)])


def appends(audio: np.ndarray) -> list[str]:
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    return [json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i:i + 4800]).decode()})
            for i in range(0, len(pcm), 4800)]


def speak(ws, messages: list[str]) -> None:
    """Send the 100 ms appends in real time, as a microphone would (a thread beside the reader)."""
    start = time.perf_counter()
    for i, message in enumerate(messages):
        time.sleep(max(0.0, start + 0.1 * i - time.perf_counter()))
        try:
            ws.send(message)
        except ConnectionClosed:  # the turn was answered and the session closed before the silence ended
            return


class AudioWatch:
    """Polls the server's `omnistage_audio_seconds_total` (audio its final stage made) in a thread."""

    def __init__(self, url: str, interval: float = 0.01):
        self.url, self.interval = url, interval
        self.samples: list[tuple[float, float]] = []  # (time, seconds of audio made so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.is_set():
                text = client.get("/metrics").text
                made = sum(float(line.split()[-1]) for line in text.splitlines()
                           if line.startswith("omnistage_audio_seconds_total"))
                self.samples.append((time.perf_counter(), made))
                self._stop.wait(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()

    def last_made_after(self, t0: float) -> tuple[float, float]:
        """(seconds from `t0` to the first sample that shows the last audio made after `t0`, 0 if
        none was; seconds of audio made after `t0`), counted from the first sample at or after `t0`."""
        after = [s for s in self.samples if s[0] >= t0]
        base = after[0][1]
        final = after[-1][1]
        if final == base:
            return 0.0, 0.0
        return next(t for t, made in after if made == final) - t0, final - base


def session(url: str, barge_in: bool, watch: AudioWatch | None = None) -> dict:
    """One turn in a fresh session; the times it saw (`watch`: started with the barge-in)."""
    with connect(url.replace("http", "ws") + "/v1/realtime", max_size=None) as ws:
        ws.recv()
        ws.send(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
            "type": "server_vad", "silence_duration_ms": 200}}}}}))
        speaker = threading.Thread(target=speak, args=(ws, appends(voice())), daemon=True)
        speaker.start()
        seen: dict = {"after_barge_in_bytes": 0, "deltas": []}
        while True:
            event = json.loads(ws.recv(timeout=300))
            now, kind = time.perf_counter(), event["type"]
            if kind == "input_audio_buffer.speech_stopped" and "stopped" not in seen:
                seen["stopped"] = now
            elif kind == "response.output_audio_transcript.delta":
                seen.setdefault("first_text", now)
            elif kind == "response.output_audio.delta":
                seen.setdefault("first_audio", now)
                seen["deltas"].append((now, len(base64.b64decode(event["delta"])) / 2 / 24000))
                if "barge_in" in seen:
                    seen["after_barge_in_bytes"] += len(base64.b64decode(event["delta"]))
                elif barge_in and "sent_barge_in" not in seen and not speaker.is_alive():  # the turn is all sent
                    seen["sent_barge_in"] = True
                    seen["barge_sent"] = time.perf_counter()
                    if watch is not None:
                        watch.start()
                    for message in appends(voice()[:24000]):
                        ws.send(message)
            elif kind == "input_audio_buffer.speech_started" and seen.get("sent_barge_in"):
                seen.setdefault("barge_in", now)
            elif kind == "response.done":
                seen["done"], seen["status"] = now, event["response"]["status"]
                usage = event["response"]["usage"] or {}
                seen["tokens"] = (usage.get("input_token_details", {}).get("cached_tokens", 0),
                                  usage.get("input_tokens", 0))
                return seen


def stalls(deltas: list[tuple[float, float]]) -> int:
    """Gaps between audio deltas longer than the audio the client had ahead of playback
    (playback starting at the first delta)."""
    count, received = 0, 0.0
    start = deltas[0][0] if deltas else 0.0
    for (t_prev, seconds), (t_next, _) in zip(deltas, deltas[1:]):
        received += seconds
        ahead = received - (t_prev - start)
        if t_next - t_prev > ahead:
            count += 1
    return count


def concurrent(url: str, num_sessions: int) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(num_sessions) as pool:
        return list(pool.map(lambda _: session(url, False), range(num_sessions)))


def chat(client: httpx.Client) -> tuple[float, float]:
    """Seconds from sending the request to the first transcript piece and to the first audio chunk."""
    wav = io.BytesIO()
    sf.write(wav, voice(), 24000, format="WAV")
    body = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {
        "data": base64.b64encode(wav.getvalue()).decode(), "format": "wav"}}]}],
        "modalities": ["text", "audio"], "audio": {"format": "pcm16"}, "stream": True, "max_tokens": 8}
    t0, first_text = time.perf_counter(), None
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if first_text is None and line.startswith("data: {") and '"transcript":' in line:
                first_text = time.perf_counter() - t0
            if line.startswith("data: {") and '"data":' in line:
                return first_text if first_text is not None else float("nan"), time.perf_counter() - t0
    raise RuntimeError("the chat completion sent no audio")


def stage_profile(path: str, turns: int) -> dict:
    """The same exchange in-process (`AsyncOmni`, same overrides): per request, the time each stage's
    engine steps took up to the first audio chunk, and the rest (orchestrator, input processors);
    the median over `turns` requests after one warm-up."""
    import asyncio

    from omnistage import AsyncOmni

    async def run() -> list[dict]:
        fresh_voices()
        omni = AsyncOmni(path, stage_overrides=json.dumps(OVERRIDES))
        steps: list[tuple[float, str, float]] = []  # (start, stage, seconds)
        for stage in omni.spec.stages:
            handle = omni.orchestrator.handles[stage.id]

            def timed(step=handle.step, name=stage.name):
                start = time.perf_counter()
                outputs = step()
                steps.append((start, name, time.perf_counter() - start))
                return outputs
            handle.step = timed
        rows = []
        try:
            for i in range(turns + 1):
                clip = voice()
                prompt = {"messages": [{"role": "user", "content": [
                    {"type": "audio", "audio": clip, "sample_rate": 24000}]}]}
                steps.clear()
                t0, first = time.perf_counter(), None
                async for out in omni.generate(prompt):
                    if first is None and out.audio_chunk is not None:
                        first = time.perf_counter()
                if i == 0:
                    continue  # warm-up
                row = {"first_audio": first - t0}
                for start, name, seconds in steps:
                    if start < first:
                        row[name] = row.get(name, 0.0) + seconds
                row["rest"] = row["first_audio"] - sum(v for k, v in row.items() if k != "first_audio")
                rows.append(row)
        finally:
            await omni.shutdown()
        return rows

    rows = asyncio.run(run())
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def bench(size: str, turns: int) -> dict:
    from omnistage.testing import ensure

    path = str(ensure("qwen2.5-omni", size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    out: dict = {"profile": stage_profile(path, 5)}
    for prefill in (True, False):
        fresh_voices()
        proc, url = start_server(path, "--stage-overrides", json.dumps(OVERRIDES),
                                 *(() if prefill else ("--no-realtime-prefill",)), timeout_s=600)
        realtime, chats, texts, barge, together, tokens = [], [], [], [], [], []
        try:
            with httpx.Client(base_url=url, timeout=300) as client:
                session(url, False), chat(client)  # warm-up
                for i in range(turns):
                    for kind in (("chat", "realtime") if i % 2 else ("realtime", "chat")):
                        if kind == "chat":
                            first_text, first_audio = chat(client)
                            chats.append(first_audio)
                            texts.append(("chat", first_text))
                        else:
                            seen = session(url, False)
                            realtime.append(seen["first_audio"] - seen["stopped"])
                            texts.append(("realtime", seen["first_text"] - seen["stopped"]))
                            tokens.append(seen["tokens"])
                if prefill:  # barge-in and load: the default server only
                    for _ in range(max(3, turns // 2)):
                        seen = session(url, True)
                        if "barge_in" in seen:
                            barge.append((seen["done"] - seen["barge_in"], seen["after_barge_in_bytes"],
                                          seen["status"]))
                    together = concurrent(url, 8)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        key = "on" if prefill else "off"
        out.update({f"realtime_{key}": realtime, f"chat_{key}": chats, f"tokens_{key}": tokens,
                    f"text_realtime_{key}": [t for k, t in texts if k == "realtime"],
                    f"text_chat_{key}": [t for k, t in texts if k == "chat"]})
        if prefill:
            out.update({"barge": barge, "together": together})
    return out


def barge_ins(size: str, rounds: int) -> list[dict]:
    """`rounds` answers interrupted by the user's speech, on a server with the default settings."""
    from omnistage.testing import ensure

    path = str(ensure("qwen2.5-omni", size=size, cache_dir=ROOT / ".omnistage-cache" / "zoo"))
    fresh_voices()
    proc, url = start_server(path, "--stage-overrides", json.dumps(BARGE_OVERRIDES), timeout_s=600)
    rows = []
    try:
        session(url, False)  # warm-up
        for _ in range(rounds):
            watch = AudioWatch(url)
            seen = session(url, True, watch)
            time.sleep(0.5)  # audio the engine still made after response.done would show here
            watch.stop()
            if "barge_in" not in seen:  # the answer ended before the user's speech was heard
                continue
            t0 = seen["barge_in"]
            engine_s, engine_audio_s = watch.last_made_after(t0)
            rows.append({"status": seen["status"],
                         "client_s": max(0.0, max(t for t, _ in seen["deltas"]) - t0),
                         "engine_s": engine_s, "engine_audio_s": engine_audio_s,
                         "chunk_s": statistics.median(seconds for _, seconds in seen["deltas"]),
                         "detect_s": t0 - seen["barge_sent"]})
        made = watch.samples[-1][1] if watch.samples else 0.0
        if not made:  # a counter that never moves would read as "no audio after speech_started"
            raise RuntimeError("the server's omnistage_audio_seconds_total counted no audio")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


def barge_in_table(rows: list[dict], size: str, rounds: int) -> str:
    def ms(key: str) -> str:
        values = [row[key] * 1000 for row in rows]
        return f"{statistics.median(values):.0f} | {max(values):.0f}"

    chunk = statistics.median(row["chunk_s"] for row in rows)
    worst = max(row["engine_s"] for row in rows)
    statuses = ", ".join(sorted({row["status"] for row in rows}))
    return "\n".join([
        f"qwen2.5-omni ({size}), thinker 8 tokens, talker 600 codes; {len(rows)} of {rounds} answers interrupted "
        f"(status {statuses}); load average {os.getloadavg()[0]:.2f} at the end.", "",
        "| from `speech_started` during an answer | p50 (ms) | max (ms) |", "|---|---|---|",
        f"| to the last audio byte the client received (0: none after) | {ms('client_s')} |",
        f"| to the last audio the engine made for the answer (0: none after; polled every 10 ms) | {ms('engine_s')} |",
        f"| audio the engine made after it (ms of sound) | {ms('engine_audio_s')} |",
        f"| one vocoder chunk: the answer's audio delta (ms of sound) | {ms('chunk_s')} |",
        f"| (before it) the barge-in speech appended -> `speech_started` | {ms('detect_s')} |", "",
        f"**Goal (<= one vocoder chunk, {chunk * 1000:.0f} ms): {'met' if worst <= chunk else 'missed'}** "
        f"(the engine's last audio for an interrupted answer at most {worst * 1000:.0f} ms after "
        "`speech_started`)."])


def table(r: dict, size: str, turns: int) -> str:
    lines = [f"qwen2.5-omni ({size}), {turns} turns each, thinker 8 tokens, talker 32 codes; load average "
             f"{os.getloadavg()[0]:.2f} at the end.", "",
             "| to the first audio byte | p50 (s) | p99 (s) | realtime / chat (p50) | first text, p50 (s) |",
             "|---|---|---|---|---|"]
    notes = []
    for key, name in (("on", "prefilled while spoken (default)"), ("off", "`--no-realtime-prefill`")):
        rt, ch = r[f"realtime_{key}"], r[f"chat_{key}"]
        cached, prompt = (statistics.mean(t[i] for t in r[f"tokens_{key}"]) for i in (0, 1))
        lines += [f"| realtime, {name}: from speech_stopped | {percentile(rt, 50):.3f} | {percentile(rt, 99):.3f} | "
                  f"{statistics.median(rt) / statistics.median(ch):.2f}x (goal <= 0.5x) | "
                  f"{statistics.median(r[f'text_realtime_{key}']):.3f} |",
                  f"| chat completion on the same server: from the request | {percentile(ch, 50):.3f} | "
                  f"{percentile(ch, 99):.3f} | | {statistics.median(r[f'text_chat_{key}']):.3f} |"]
        notes.append(f"{name}: {cached:.0f} of {prompt:.0f} prompt tokens a turn from the thinker's prefix cache "
                     "(mean)")
    lines += ["", "; ".join(notes) + "."]
    profile = r["profile"]
    lines += ["", "Where the engine's time to first audio goes (the same exchange in-process, median of 5 requests; "
              "each stage's engine steps up to the first audio chunk): "
              + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in profile.items()
                          if name not in ("first_audio", "rest"))
              + f", the rest (orchestrator, input processors) {profile['rest'] * 1000:.0f} ms; "
              f"{profile['first_audio'] * 1000:.0f} ms in all."]
    ratio = statistics.median(r["realtime_on"]) / statistics.median(r["chat_on"])
    lines += ["", f"**Goal (<= 0.5x): {'met' if ratio <= 0.5 else 'missed'}** ({ratio:.2f}x with the prefill)."]
    if r["barge"]:
        cut = [b[0] for b in r["barge"]]
        after = [b[1] / 2 / 24000 for b in r["barge"]]
        statuses = sorted({b[2] for b in r["barge"]})
        lines += ["", f"Barge-in over {len(cut)} answers (status {', '.join(statuses)}): speech_started -> "
                  f"response.done p50 {statistics.median(cut) * 1000:.0f} ms (max {max(cut) * 1000:.0f} ms); "
                  f"audio sent after speech_started p50 {statistics.median(after) * 1000:.0f} ms of sound "
                  f"(max {max(after) * 1000:.0f} ms)."]
    elif "barge" in r:
        lines += ["", "Barge-in: no answer was still speaking when the user's speech was heard (32 codes are voiced "
                  "within a few DiT windows); `--barge-in N` measures it on 600-code answers."]
    if r["together"]:
        gaps = [stalls(seen["deltas"]) for seen in r["together"]]
        first = [seen["first_audio"] - seen["stopped"] for seen in r["together"]]
        audio = [sum(d[1] for d in seen["deltas"]) for seen in r["together"]]
        lines += ["", f"8 sessions at once, one turn each: {sum(1 for g in gaps if g)} of 8 stalled ({sum(gaps)} "
                  f"stalls in all); first audio {min(first):.2f}-{max(first):.2f} s after speech_stopped; "
                  f"{min(audio):.2f}-{max(audio):.2f} s of audio per answer."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--barge-in", type=int, default=0, metavar="N",
                        help="measure only barge-in, over N interrupted answers")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.barge_in:
        body = barge_in_table(barge_ins(args.size, args.barge_in), args.size, args.barge_in) + "\n\n" + BARGE_NOTE
        print(body)
        if not args.no_write:
            write_section("Realtime voice: barge-in", "benchmarks/bench_realtime.py", body)
        return
    body = table(bench(args.size, args.turns), args.size, args.turns) + (
        "\n\n" + NOTE)
    print(body)
    if not args.no_write:
        write_section("Realtime voice: prefill while the user speaks", "benchmarks/bench_realtime.py", body)


if __name__ == "__main__":
    main()
