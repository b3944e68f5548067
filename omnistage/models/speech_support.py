"""The speech support table: every family that speaks x its voices, streaming and batch, read
from what each family declares next to its pipeline (`declare_speech` in its `__init__.py`).

A family says where it speaks (`route`: the speech routes, an omni model's chat, or a
full-duplex realtime session) and which voices it offers; the streaming and batch columns
follow from the route. scripts/gen_docs.py writes the table into README.md and
docs/reference/support.md, and `omnistage models --speech` prints it, so it cannot drift from
the declarations; tests/models/test_speech_support.py checks each declaration against the
family's spec resolved from its zoo checkpoint (the voices its request extras take, the routes
it serves). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Route = Literal["speech", "chat", "duplex"]

STREAMING: dict[str, str] = {
    "speech": "HTTP chunks (`stream`), SSE (`stream_format: sse`), `WS /v1/audio/speech/stream`",
    "chat": "chat SSE (`stream`), `WS /v1/realtime`",
    "duplex": "`WS /v1/realtime?duplex=1`, `WS /v1/duplex`",
}
"""How each route streams the audio as it is made."""

BATCH: dict[str, str] = {
    "speech": "`POST /v1/audio/speech/batch`",
    "chat": "`POST /v1/chat/completions/batch`",
    "duplex": "no (a session is one live stream)",
}
"""Where many requests go in one body, each answered with its own status."""

COLUMNS = ("family", "speaks through", "preset voices", "designed voice", "cloned voice", "streaming", "batch")


@dataclass(frozen=True)
class SpeechSupport:
    family: str
    """The family's name as the README's tables give it."""
    route: Route
    """`speech`: POST /v1/audio/speech reads the input aloud; `chat`: an omni model answers with
    audio (`modalities: ["audio"]`); `duplex`: it listens while it speaks (realtime sessions)."""
    preset: str = ""
    """The built-in voices `voice` names (which ones, or where they come from); "" for none."""
    designed: str = ""
    """How a voice is described in words (`instructions`); "" when it cannot be."""
    cloned: str = ""
    """What cloning a voice takes (`ref_audio`, `ref_text`, a registered voice); "" when it cannot."""

    def cells(self) -> list[str]:
        return [self.family, self.route, self.preset or "no", self.designed or "no", self.cloned or "no",
                STREAMING[self.route], BATCH[self.route]]


_DECLARED: dict[str, SpeechSupport] = {}


def declare_speech(key: str, support: SpeechSupport) -> None:
    """What the family registered under pipeline `key` offers for speech."""
    if key in _DECLARED:
        raise ValueError(f"speech support for {key!r} is already declared")
    _DECLARED[key] = support


def declared() -> dict[str, SpeechSupport]:
    """Pipeline key -> declaration, for every family (imported first)."""
    from omnistage.config.registry import REGISTRY

    REGISTRY.discover()
    return dict(_DECLARED)


def rows() -> list[SpeechSupport]:
    order = list(STREAMING)
    return sorted(declared().values(), key=lambda s: (order.index(s.route), s.family.lower()))


def markdown(rows: list[SpeechSupport]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(row.cells()) + " |" for row in rows])


def text(rows: list[SpeechSupport]) -> str:
    """The table as one block per family (the CLI: the cells are too long for columns)."""
    blocks = []
    for row in rows:
        cells = row.cells()
        blocks.append("\n".join([cells[0]] + [f"  {name}: {cell}" for name, cell in zip(COLUMNS[1:], cells[1:])]))
    return "\n\n".join(blocks)
