"""Spec builders shared by the config tests (imported as a plain module)."""

from __future__ import annotations

from omnistage.config import PipelineSpec, StageSpec


def stage(id, name=None, kind="ar", output="text", **kw) -> StageSpec:
    return StageSpec(id=id, name=name or f"s{id}", kind=kind, output=output, **kw)


def chunker(request, chunk):  # a stand-in chunk processor
    return chunk


def three_stage(overrides: dict[int, dict] | None = None) -> PipelineSpec:
    """thinker (ar) -> talker (ar, streams) -> vocoder (generation); like an omni model."""
    stages = [
        stage(0, "thinker", final_output=True),
        stage(1, "talker", output="tokens", inputs=(0,), chunk_processor=chunker),
        stage(2, "vocoder", kind="generation", output="audio", inputs=(1,), stream_input=True, final_output=True),
    ]
    for sid, kw in (overrides or {}).items():
        s = stages[sid]
        stages[sid] = StageSpec(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, **kw})
    return PipelineSpec(name="omni", stages=tuple(stages))
