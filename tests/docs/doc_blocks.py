"""The fenced code blocks of the docs (docs/**/*.md and README.md), with their test marks.

A block is marked by an HTML comment on the line right above its fence:
- `<!-- docs-test: skip REASON -->`: not run; the reason is required.
- `<!-- docs-test: server -->`: the `omnistage serve` command whose server the HTTP examples
  talk to (at 127.0.0.1:8000 in the text); every such block must name the same command.
The README's two set-up commands are not run either: one installs and serves until stopped,
the other runs the whole suite, this test included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
RUN_LANGS = {"bash", "sh", "shell", "python"}
SETUP_COMMANDS = {
    "bash scripts/serve.sh": "installs into .venv and serves until stopped; the docs test starts the same server",
    "bash scripts/test.sh": "runs the whole suite, of which the docs test is a part",
}

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*docs-test:\s*(skip|server)\b\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    mark: str | None  # "skip", "server" or None
    reason: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def needs_server(self) -> bool:
        return ":8000" in self.code

    def commands(self) -> list[str]:
        """Shell lines with backslash continuations joined, blank and comment-only lines dropped."""
        joined = re.sub(r"\\\n\s*", " ", self.code)
        return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def blocks() -> list[Block]:
    found = []
    for path in DOC_FILES:
        text = path.read_text()
        for match in _FENCE.finditer(text):
            above = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(above)
            lang, code = match[1].lower(), match[2]
            kind, reason = (mark[1], mark[2]) if mark else (None, "")
            first = code.strip().split("#")[0].strip()
            if kind is None and first in SETUP_COMMANDS:
                kind, reason = "skip", SETUP_COMMANDS[first]
            found.append(Block(path, text.count("\n", 0, match.start()) + 1, lang, code, kind, reason))
    return found
