"""Frozen pipeline topology: what a model *is* as a graph of stages.

A `PipelineSpec` is a DAG of `StageSpec`s. Constructing a `StageSpec` checks the stage
on its own (kind, modality, deploy defaults); constructing a `PipelineSpec` checks the
graph (ids, inputs, cycles, entry and final stages, streamed edges). Each raises one
`ValueError` that lists every problem found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omnistage.config.deploy_fields import STAGE_CONSTRAINTS, StageDeployConfig
from omnistage.config.validation import check_fields, format_problems, unknown_key

STAGE_KINDS = ("ar", "diffusion", "generation")
MODALITIES = ("text", "tokens", "image", "video", "audio", "latent")


class ReadOnlyDict(dict):
    """A dict that refuses changes, so a frozen spec stays frozen. Unlike `mappingproxy`
    it pickles and deep-copies, so specs can travel to stage processes and Ray actors."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"{type(self).__name__} is read-only")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        return (type(self), (dict(self),))


@dataclass(frozen=True)
class StageSpec:
    id: int
    """Unique within the pipeline; deploy files and `--stage-overrides` address stages by it."""
    name: str
    """Human-readable name, e.g. "thinker"; params dicts may be keyed by it."""
    kind: str
    """Engine kind: one of STAGE_KINDS."""
    output: str
    """Output modality: one of MODALITIES, or a `+` combination such as "text+audio"."""
    inputs: tuple[int, ...] = ()
    """Upstream stage ids; empty for an entry stage."""
    final_output: bool = False
    """Whether this stage's outputs are returned to the user."""
    model: str | None = None
    """Key of the stage model implementation (registered by a `models/` family); None = generic."""
    input_processor: Callable[..., Any] | None = None
    """Builds this stage's input from upstream outputs: (request, {stage_id: payload}) -> input.

    `request` is the orchestrator's `OmniRequest` (request_id, prompt as the user gave it,
    params by stage id). An entry stage gets `{}`; a whole hand-off gets every input's
    finished payload; a streamed hand-off gets `{upstream id: partial}` once per chunk.
    Without a processor a stage gets the prompt (entry stage), its one upstream payload,
    or the `{stage_id: payload}` dict. Raising fails the request, naming this stage."""
    chunk_processor: Callable[..., Any] | None = None
    """Set on a stage that streams to downstream: (request, payload, finished) -> partial payload or None.

    Called with each of this stage's outputs in order (progress excluded); the last call
    has finished=True, so it can flush what it buffered, and its payload is the stage's
    last output (None if the stage ended without a new one). Each partial payload becomes
    one engine request of every downstream stage."""
    stream_input: bool = False
    """This stage accepts streamed chunks from its (single) upstream before it finishes:
    it runs one engine request per chunk (`{request_id}#{n}`), and its outputs are put
    back in chunk order."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Pipeline defaults for this stage's deploy fields (lowest precedence)."""
    hard: Mapping[str, Any] = field(default_factory=dict)
    """Deploy fields this stage forces whatever the user says (e.g. max_num_seqs=1)."""

    def __post_init__(self) -> None:
        # Normalise the containers a caller may pass as list/dict; the spec is frozen,
        # so the mappings become read-only copies.
        if isinstance(self.inputs, list):
            object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "defaults", ReadOnlyDict(self.defaults))
        object.__setattr__(self, "hard", ReadOnlyDict(self.hard))
        problems = self.get_validation_errors()
        if problems:
            raise ValueError(format_problems(f"invalid stage {self.label}:", problems))

    def __hash__(self) -> int:
        # The generated hash would fail on the mapping fields; equal specs agree on these.
        return hash((self.id, self.name, self.kind, self.output, self.inputs))

    @property
    def label(self) -> str:
        """How messages name this stage: `1 (talker)`."""
        return f"{self.id} ({self.name})"

    @property
    def modalities(self) -> tuple[str, ...]:
        """The output split into single modalities: "text+audio" -> ("text", "audio")."""
        return tuple(self.output.split("+"))

    def get_validation_errors(self) -> list[str]:
        """Problems of this stage on its own; the graph is checked by `PipelineSpec`."""
        problems = []
        if not _is_int(self.id) or self.id < 0:
            problems.append(f"id must be a non-negative int, got {self.id!r}")
        if not isinstance(self.name, str) or not self.name:
            problems.append(f"name must be a non-empty string, got {self.name!r}")
        if self.kind not in STAGE_KINDS:
            problems.append(f"kind: {unknown_key(self.kind, STAGE_KINDS, 'stage kind')}")
        problems += _modality_problems(self.output)
        if not isinstance(self.inputs, tuple) or not all(_is_int(i) for i in self.inputs):
            problems.append(f"inputs must be a tuple of stage ids, got {self.inputs!r}")
        elif len(set(self.inputs)) != len(self.inputs):
            problems.append(f"inputs name a stage twice: {list(self.inputs)}")
        if self.stream_input and len(self.inputs) != 1:
            problems.append(f"stream_input=True needs exactly one input stage, has {len(self.inputs)}")
        for name in ("input_processor", "chunk_processor"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                problems.append(f"{name} must be callable, got {value!r}")
        for which in ("defaults", "hard"):
            _, field_problems = check_fields(StageDeployConfig, getattr(self, which), STAGE_CONSTRAINTS)
            problems += [f"{which}: {p}" for p in field_problems]
        both = sorted(set(self.defaults) & set(self.hard))
        if both:
            problems.append(f"{both} in both defaults and hard; the hard value always wins, drop the default")
        return problems


@dataclass(frozen=True)
class SpeechToText:
    """How a speech recognition family is asked for a transcript (POST /v1/audio/transcriptions)
    and how its answer reads. A pipeline without one is asked as an omni thinker is: a chat
    message of the audio and an instruction to transcribe it."""

    prompt: Callable[..., Any]
    """(audio, sample_rate, language or None, context or None) -> the entry stage's prompt;
    raises `RequestError("language", ...)` for a language the model does not know."""
    parse: Callable[..., tuple[str | None, str]]
    """(text generated so far, language asked or None, final) -> (the language, the transcript so
    far): what of the text is transcript, and the language the model names (or was asked for)."""


@dataclass(frozen=True)
class Duplex:
    """How a full-duplex family hears a live audio stream (WS /v1/realtime?duplex=1, WS
    /v1/duplex): a session is one engine request that runs while the user speaks. Its prompt
    opens the stream and each `AsyncOmni.update` carries the next audio, both as `inputs`
    builds them; the entry AR stage waits for audio it has not heard yet."""

    sample_rate: int
    """The rate of the audio the model hears and speaks (Hz)."""
    frame_ms: float
    """One model step: the audio it hears and speaks per step (the sessions' `chunk_period_ms`)."""
    inputs: Callable[..., Any]
    """(audio: float32 mono at `sample_rate`, final: bool) -> the entry stage's prompt or update."""
    params: Callable[[], dict[str, Any]]
    """() -> a session's per-stage params beside the entry stage's sampling (e.g. a codec's
    chunking: one frame at a time)."""


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    stages: tuple[StageSpec, ...]
    request_extras: Mapping[str, Any] = field(default_factory=dict)
    """Model-declared request extras: name -> ExtraSpec (type, range, default)."""
    speech_to_text: SpeechToText | None = None
    """Set by a speech recognition family (audio in, text out): transcriptions ask it through this."""
    duplex: Duplex | None = None
    """Set by a full-duplex family (it listens while it speaks): realtime sessions run through this."""
    dropped_stages: tuple[int, ...] = ()
    """Ids of the family's full pipeline that this variant leaves out (e.g. an omni model's
    audio stages when only text is served): deploy-file entries for them are ignored, not
    rejected, so one family deploy file serves every variant."""

    def __post_init__(self) -> None:
        if isinstance(self.stages, list):
            object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "dropped_stages", tuple(self.dropped_stages))
        problems = self.get_validation_errors()
        if problems:
            raise ValueError(format_problems(f"invalid pipeline {self.name!r}:", problems))

    def __hash__(self) -> int:
        return hash((self.name, self.stages))

    # --- queries the orchestrator walks the graph with ------------------------------

    def get_stage(self, stage_id: int) -> StageSpec:
        for stage in self.stages:
            if stage.id == stage_id:
                return stage
        raise KeyError(f"pipeline {self.name!r} has no stage {stage_id}; stages: {self.describe_stages()}")

    @property
    def stage_ids(self) -> tuple[int, ...]:
        return tuple(s.id for s in self.stages)

    @property
    def entry_stages(self) -> tuple[StageSpec, ...]:
        """Stages with no inputs: the request's prompt goes to them."""
        return tuple(s for s in self.stages if not s.inputs)

    @property
    def final_stages(self) -> tuple[StageSpec, ...]:
        """Stages whose outputs are returned to the user."""
        return tuple(s for s in self.stages if s.final_output)

    def downstream_of(self, stage_id: int) -> tuple[StageSpec, ...]:
        """Stages that take `stage_id`'s output as an input."""
        return tuple(s for s in self.stages if stage_id in s.inputs)

    def topological_order(self) -> tuple[int, ...]:
        """Stage ids, every stage after all of its inputs (ties keep declaration order)."""
        done: list[int] = []
        remaining = list(self.stages)
        while remaining:
            ready = [s for s in remaining if all(i in done for i in s.inputs)]
            done += [s.id for s in ready]
            remaining = [s for s in remaining if s not in ready]
        return tuple(done)

    def describe_stages(self) -> str:
        return ", ".join(s.label for s in self.stages)

    # --- validation ---------------------------------------------------------------

    def get_validation_errors(self) -> list[str]:
        """Every problem of the graph; the stages are already valid on their own."""
        if not isinstance(self.name, str) or not self.name:
            return [f"name must be a non-empty string, got {self.name!r}"]
        if not self.stages:
            return ["no stages"]
        if not all(isinstance(s, StageSpec) for s in self.stages):
            return [f"stages must be StageSpec objects, got {[type(s).__name__ for s in self.stages]}"]
        problems = []
        ids = [s.id for s in self.stages]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            problems.append(f"duplicate stage ids: {duplicates}")
        known = set(ids)
        for stage in self.stages:
            for upstream in stage.inputs:
                if upstream == stage.id:
                    problems.append(f"stage {stage.label} lists itself as an input")
                elif upstream not in known:
                    problems.append(
                        f"stage {stage.label} has input {upstream}, which is not a stage id {sorted(known)}"
                    )
        problems += [f"cycle: {' -> '.join(map(str, c))}" for c in self._find_cycles()]
        if not self.entry_stages:
            problems.append("no entry stage (a stage with empty inputs)")
        if not self.final_stages:
            problems.append("no stage has final_output=True")
        for stage in self.stages:
            if not stage.final_output and not self.downstream_of(stage.id):
                problems.append(f"stage {stage.label} is not final_output and feeds no stage: its output goes nowhere")
        problems += self._stream_problems(known)
        both = sorted(known & set(self.dropped_stages))
        if both:
            problems.append(f"dropped_stages {both} are stages of the pipeline")
        return problems

    def _find_cycles(self) -> list[list[int]]:
        """Each distinct cycle once, as a closed path of ids (`[1, 2, 1]`)."""
        inputs: dict[int, list[int]] = {}
        for s in self.stages:  # duplicate ids (reported apart) pool their inputs
            inputs.setdefault(s.id, []).extend(i for i in s.inputs if i != s.id)  # so do self-loops
        cycles: list[list[int]] = []
        seen_cycles: set[frozenset[int]] = set()
        state: dict[int, str] = {}  # "active" while on the DFS path, "done" after

        def visit(node: int, path: list[int]) -> None:
            state[node] = "active"
            path.append(node)
            for upstream in inputs.get(node, ()):
                if upstream not in inputs:
                    continue  # unknown input, reported elsewhere
                if state.get(upstream) == "active":
                    # Walking inputs goes against the data flow; reverse to read as it flows.
                    loop = path[path.index(upstream):]
                    if frozenset(loop) not in seen_cycles:
                        seen_cycles.add(frozenset(loop))
                        cycles.append(list(reversed(loop)) + [loop[-1]])
                elif upstream not in state:
                    visit(upstream, path)
            path.pop()
            state[node] = "done"

        for stage_id in inputs:
            if stage_id not in state:
                visit(stage_id, [])
        return cycles

    def _stream_problems(self, known: set[int]) -> list[str]:
        # A streamed edge must agree at both ends: the upstream emits chunks (has a
        # chunk_processor) exactly when the downstream consumes them (stream_input).
        # The orchestrator checks nothing of this at run time; it trusts the spec.
        problems = []
        by_id = {s.id: s for s in self.stages}
        for stage in self.stages:
            if stage.stream_input and len(stage.inputs) == 1 and stage.inputs[0] in known:
                upstream = by_id[stage.inputs[0]]
                if upstream.chunk_processor is None:
                    problems.append(
                        f"stage {stage.label} has stream_input=True but its input {upstream.label} "
                        "has no chunk_processor"
                    )
            if stage.chunk_processor is not None:
                downstream = self.downstream_of(stage.id)
                if not downstream:
                    problems.append(f"stage {stage.label} has a chunk_processor but no downstream stage")
                for d in downstream:
                    if not d.stream_input:
                        problems.append(
                            f"stage {stage.label} has a chunk_processor but its downstream {d.label} "
                            "has stream_input=False"
                        )
        return problems


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _modality_problems(output: Any) -> list[str]:
    if not isinstance(output, str) or not output:
        return [f"output must be a modality string, got {output!r}"]
    parts = output.split("+")
    problems = [f"output: {unknown_key(p, MODALITIES, 'modality')}" for p in parts if p not in MODALITIES]
    if len(set(parts)) != len(parts):
        problems.append(f"output {output!r} names a modality twice")
    return problems
