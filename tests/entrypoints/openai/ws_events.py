"""Reading a WebSocket session's server events in the realtime and video chat tests."""

from __future__ import annotations


def until(ws, kind: str) -> list[dict]:
    """Events up to and including the first of type `kind`."""
    events = []
    while True:
        events.append(ws.receive_json())
        if events[-1]["type"] == kind:
            return events
