"""Stored responses: one SQLite table, in memory, or on disk under the server's `--output-dir`.

    <directory>/responses.sqlite3    one row per response: its id, when it was made, its record (JSON)

A record is the public response object, the input items of its own request, and the
conversation before them (`context`: every earlier turn's input and output items), so
`previous_response_id` continues a conversation from one row, even when the responses
before it have expired. Bounded two ways: rows older than `ttl_s` are dropped and, past
`max_rows`, the oldest go first. On disk a restarted server finds its responses again; a
background response that was queued or running then cannot resume (its engine request
died with the process), so `open` marks it `failed` with that reason.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

UNFINISHED = ("queued", "in_progress")
INTERRUPTED = {"code": "server_error", "message": "the server stopped before the response finished; create it again"}


class ResponseStore:
    def __init__(self, directory: str | Path | None, ttl_s: float, max_rows: int):
        self.ttl_s = ttl_s
        self.max_rows = max_rows
        target = ":memory:"
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            target = str(Path(directory) / "responses.sqlite3")
        self._db = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
        if directory is not None:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL keeps it consistent; a crash may lose the last rows
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                         "id TEXT UNIQUE NOT NULL, created_at REAL NOT NULL, record TEXT NOT NULL)")
        self._fail_unfinished()

    def _fail_unfinished(self) -> None:
        for response_id, text in self._db.execute("SELECT id, record FROM responses").fetchall():
            record = json.loads(text)
            if record["response"]["status"] in UNFINISHED:
                record["response"].update(status="failed", error=INTERRUPTED)
                self._db.execute("UPDATE responses SET record = ? WHERE id = ?", (json.dumps(record), response_id))

    def save(self, response: dict[str, Any], input_items: list[dict[str, Any]],
             context: list[dict[str, Any]]) -> None:
        record = json.dumps({"response": response, "input_items": input_items, "context": context})
        self._db.execute("INSERT INTO responses (id, created_at, record) VALUES (?, ?, ?) "
                         "ON CONFLICT(id) DO UPDATE SET record = excluded.record",
                         (response["id"], response["created_at"], record))
        self._evict()

    def update(self, response: dict[str, Any]) -> None:
        """Replace a stored response object (a background response as it progresses)."""
        record = self.get(response["id"])
        if record is not None:
            record["response"] = response
            self._db.execute("UPDATE responses SET record = ? WHERE id = ?", (json.dumps(record), response["id"]))

    def get(self, response_id: str) -> dict[str, Any] | None:
        """The record ({response, input_items, context}), or None (unknown, deleted or expired)."""
        row = self._db.execute("SELECT record FROM responses WHERE id = ? AND created_at >= ?",
                               (response_id, time.time() - self.ttl_s)).fetchone()
        return json.loads(row[0]) if row else None

    def delete(self, response_id: str) -> bool:
        return self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def _evict(self) -> None:
        self._db.execute("DELETE FROM responses WHERE created_at < ?", (time.time() - self.ttl_s,))
        self._db.execute("DELETE FROM responses WHERE seq <= "
                         "(SELECT seq FROM responses ORDER BY seq DESC LIMIT 1 OFFSET ?)", (self.max_rows,))

    def close(self) -> None:
        self._db.close()
