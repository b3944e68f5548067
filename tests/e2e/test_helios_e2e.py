"""`omnistage serve` on the tiny Helios zoo model behind an API key (one server for the module):
`WS /v1/realtime/video` with a plain `websockets` client: the
video arrives chunk by chunk as fragmented MP4 whose bytes, concatenated, remux with PyAV into
one MP4 of the whole video; a bad event is an error naming the field and the session goes on;
session.stop aborts the engine request (the queue is back to 0 and the engine is free at once
for `POST /v1/videos/sync`, whose video is the streamed one);
a prompt update (session.interaction) applies from the next chunk; the upgrade needs the key."""

from __future__ import annotations

import io
import json
import time

import av
import numpy as np
import pytest
from remote_server import RemoteServer
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from omnistage.media.video import decode_video

pytestmark = pytest.mark.e2e

KEY = "k3y"
# Two chunks of two latent frames (5 frames each; the video is trimmed to 4k + 1 = 9 frames).
START = {"type": "session.start", "prompt": "a wave", "size": "64x64", "fps": 8, "num_frames": 10,
         "format": "m4s", "num_inference_steps": 2, "guidance_scale": 1.0, "seed": 1,
         "num_latent_frames_per_chunk": 2, "max_sequence_length": 16}


@pytest.fixture(scope="module")
def server(zoo):
    server = RemoteServer(zoo("helios"), "--served-model-name", "helios", api_key=KEY, in_process=True)
    yield server
    assert server.stop() == 0


def ws(server: RemoteServer):
    url = server.url.replace("http://", "ws://") + "/v1/realtime/video"
    return connect(url, additional_headers={"Authorization": f"Bearer {KEY}"})


def events_until(conn, last: str) -> tuple[list[dict], list[bytes]]:
    """JSON events and binary frames, in order, until an event of type `last`."""
    events, frames = [], []
    while True:
        message = conn.recv(timeout=60)
        if isinstance(message, bytes):
            frames.append(message)
            continue
        events.append(json.loads(message))
        if events[-1]["type"] == last:
            return events, frames


def queue_depth(server: RemoteServer) -> float:
    text = server.http().get("/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("omnistage_queue_depth ")))


def remux(data: bytes) -> bytes:
    """The fragmented stream copied (not re-encoded) into a plain MP4 by PyAV."""
    out = io.BytesIO()
    with av.open(io.BytesIO(data)) as src, av.open(out, "w", format="mp4") as dst:
        stream = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                dst.mux(packet)
    return out.getvalue()


def sync_video(server: RemoteServer) -> np.ndarray:
    """START's video from POST /v1/videos/sync."""
    form = {k: str(v) for k, v in START.items() if k not in ("type", "format")}
    resp = server.http().post("/v1/videos/sync", data=form)
    assert resp.status_code == 200, resp.text
    frames, fps = decode_video(resp.content)
    assert frames.shape == (9, 64, 64, 3) and fps == 8
    return frames


def test_stream_chunks_remux_into_one_mp4(server):
    with ws(server) as conn:
        conn.send(json.dumps({"type": "session.ping"}))
        conn.send(json.dumps({**START, "fps": "fast"}))  # bad: an error naming the field, the session goes on
        conn.send(json.dumps({"type": "session.dance"}))
        conn.send(json.dumps(START))
        events, frames = events_until(conn, "session.done")
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["session.pong", "error", "error"], events
    assert events[1]["param"] == "fps" and "type" in events[2]["message"]
    assert kinds[3:] == ["video.start", "video.chunk_metadata", "video.chunk_metadata", "session.done"], kinds
    start, chunks, done = events[3], events[4:6], events[6]
    assert start["format"] == "m4s" and start["request_id"] and start["fps"] == 8
    assert [c["generation_chunk_index"] for c in chunks] == [0, 1]
    assert [c["num_frames"] for c in chunks] == [5, 4]  # the last chunk trimmed as diffusers trims the video
    assert [c["byte_length"] for c in chunks] == [len(f) for f in frames]
    assert frames[0][4:8] == b"ftyp" and frames[1][4:8] == b"moof"  # the init segment comes first, once
    assert done == {"type": "session.done", "total_chunks": 2, "reason": "completed"}

    STREAMED.append(decode_video(remux(b"".join(frames))))
    got, fps = STREAMED[0]
    assert got.shape == (9, 64, 64, 3) and fps == 8


STREAMED: list = []
"""The streamed video, decoded, which the stop test compares with the sync one."""


def test_a_prompt_update_applies_from_the_next_chunk(server):
    update = {"type": "session.interaction",
              "interaction": {"event_id": "e1", "event": {"prompt": "a red car"}, "transition_chunks": 0}}
    conflict = {**update, "interaction": {**update["interaction"], "event": {"prompt": "a blue car"}}}
    with ws(server) as conn:
        conn.send(json.dumps(update))  # before the start: nothing to update
        conn.send(json.dumps({**START, "num_frames": 15}))  # three chunks
        events_until(conn, "video.start")
        for message in (update, update, conflict):  # the same again is a retry; another payload a conflict
            conn.send(json.dumps(message))
        events, _ = events_until(conn, "session.done")
    kinds = [e["type"] for e in events]
    assert kinds.count("session.interaction.queued") == 2 and kinds.count("error") == 1, events
    assert next(e for e in events if e["type"] == "error")["param"] == "interaction.event_id"
    chunks = [e for e in events if e["type"] == "video.chunk_metadata"]
    assert len(chunks) == 3 and chunks[0]["started_event_ids"] == []
    # Sent during chunk 0, applied once, from the chunk after the one it arrived in.
    started = [c["generation_chunk_index"] for c in chunks if c["started_event_ids"] == ["e1"]]
    assert len(started) == 1 and started[0] >= 1
    assert chunks[started[0]]["completed_event_ids"] == ["e1"]  # a hard update completes at once


def test_stop_aborts_the_engine_request(server):
    with ws(server) as conn:
        conn.send(json.dumps({**START, "num_inference_steps": 400}))  # minutes of denoising
        events, _ = events_until(conn, "video.start")
        began = time.monotonic()
        conn.send(json.dumps({"type": "session.stop"}))
        events, _ = events_until(conn, "session.done")
    assert events[-1] == {"type": "session.done", "total_chunks": 0, "reason": "stopped"}
    deadline = time.time() + 10
    while queue_depth(server) != 0 and time.time() < deadline:
        time.sleep(0.05)
    assert queue_depth(server) == 0
    # The engine is free: a new request does not wait behind the stopped one; it is the same
    # video as the streamed one (both H.264 at the same quality).
    want = sync_video(server)
    assert time.monotonic() - began < 20
    if STREAMED:
        assert np.abs(STREAMED[0][0].astype(int) - want.astype(int)).mean() < 8


def test_the_upgrade_needs_the_key(server):
    url = server.url.replace("http://", "ws://") + "/v1/realtime/video"
    with pytest.raises(InvalidStatus) as refused:  # refused on the upgrade
        connect(url)
    assert refused.value.response.status_code == 403
