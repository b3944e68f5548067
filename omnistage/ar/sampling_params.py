"""Per-request sampling parameters for AR stages, with vLLM's field names.

Plain Python (no torch import): `omnistage` exports `SamplingParams` lazily and the
OpenAI layer builds it from request bodies without paying for torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from omnistage.ar.structured_outputs import StructuredOutputsParams
from omnistage.core.errors import RequestError, RequestErrors
from omnistage.core.lora import LoraRequest

_GREEDY_EPS = 1e-5  # vLLM treats temperature below this as greedy
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit
MIN_PENALTY, MAX_PENALTY = 0.01, 100.0
"""repetition_penalty's range: past it a logit scaled by the penalty overflows a half-precision
float (inf, then NaN probabilities), and no useful setting lies there (vLLM's examples stay in 1-2)."""


@dataclass
class SamplingParams:
    """How one request samples tokens. Construction validates every field.

    Greedy decoding is `temperature=0`. `top_k=1` with any temperature also picks the
    most likely token. Penalties and `min_tokens` apply to greedy requests too.
    """

    max_tokens: int | None = 16
    """Most tokens to generate; None = until max_model_len."""
    min_tokens: int = 0
    """EOS and `stop_token_ids` are masked, and stop strings ignored, until this many tokens exist."""
    temperature: float = 1.0
    """0 = greedy; otherwise logits are divided by it before sampling."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to at least top_p, in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 (or -1, vLLM's old spelling) = all."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the top token's, in [0, 1]."""
    repetition_penalty: float = 1.0
    """> 1 discourages tokens already in the prompt or output (the HF/vLLM rule: positive logits
    are divided by it, negative ones multiplied)."""
    stop: list[str] = field(default_factory=list)
    """Stop strings; the output text ends before the first one found (it is not included)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end the request like EOS (the id is kept in `token_ids`)."""
    seed: int | None = None
    """Per-request RNG seed: the same seed gives the same tokens whatever else is in the batch."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks); `stop_token_ids` still apply."""
    logprobs: int | None = None
    """Return each output token's log-probability and this many most likely alternatives
    (0 = the sampled token's only), from the sampler's processed distribution: after
    penalties, the grammar mask and temperature, before top-k/top-p/min-p truncation."""
    structured_outputs: StructuredOutputsParams | None = None
    """A grammar every output token follows (JSON schema, JSON object, regex, choice, Lark)."""
    lora: LoraRequest | None = None
    """A LoRA adapter by name and scale (deploy `lora_adapters`, or one loaded by path before), or a
    peft folder loaded on first use with its `path` (deploy `max_loras`): native AR engine only."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "SamplingParams":
        # Remember which fields the caller gave, so deploy defaults can fill the others field by
        # field (`with_defaults`), as DiffusionParams' unset (None) fields are filled.
        self = super().__new__(cls)
        self._fields_set = frozenset([f.name for f in fields(cls)][: len(args)]) | frozenset(kwargs)
        return self

    @property
    def fields_set(self) -> frozenset[str]:
        """The fields given at construction (the rest hold the class defaults)."""
        return getattr(self, "_fields_set", frozenset())

    def with_defaults(self, defaults: "SamplingParams") -> "SamplingParams":
        """These params over `defaults`: a field this request gave wins, every other field takes
        the value `defaults` gave (the deploy's `default_sampling_params`), else the value it
        holds unset (the class default, or a route's `fallback` from `from_dict`)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({name: getattr(defaults, name) for name in defaults.fields_set})
        values.update({name: getattr(self, name) for name in self.fields_set})
        return self._built(values, self.fields_set | defaults.fields_set)

    def replace(self, **changes: Any) -> "SamplingParams":
        """A copy with `changes` given; the fields left unset stay unset, so the stage's deploy
        defaults still fill them (`dataclasses.replace` would mark every field given)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return self._built({**values, **changes}, self.fields_set | frozenset(changes))

    @classmethod
    def _built(cls, values: dict[str, Any], fields_set: frozenset[str]) -> "SamplingParams":
        params = cls(**values)
        params._fields_set = fields_set
        return params

    def __post_init__(self) -> None:
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        if isinstance(self.lora, dict):
            try:
                self.lora = LoraRequest(**self.lora)
            except ValueError as exc:  # pydantic's ValidationError: the first problem, by its field
                first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": (), "msg": str(exc)}
                where = ".".join(["lora", *map(str, first["loc"])])
                raise RequestError(where, f"{where}: {first['msg']}") from None
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        # Anything but a list stays as given, for `_problems` to name (list(5) would raise TypeError).
        if isinstance(self.stop, (list, tuple)):
            self.stop = list(self.stop)
        if isinstance(self.stop_token_ids, (list, tuple)):
            self.stop_token_ids = list(self.stop_token_ids)
        if self.top_k == -1:
            self.top_k = 0
        problems = self._problems()
        if problems:
            raise RequestErrors(problems)

    def _problems(self) -> list[RequestError]:
        p: list[RequestError] = []

        def bad(field: str, message: str) -> None:
            p.append(RequestError(field, message))

        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            bad("max_tokens", f"max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        elif self.max_tokens is not None and _is_int(self.max_tokens) and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if not _is_num(self.temperature) or self.temperature < 0:
            bad("temperature", f"temperature must be >= 0, got {self.temperature!r}")
        if not _is_num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            bad("top_k", f"top_k must be an integer >= 0 (0 or -1 = disabled), got {self.top_k!r}")
        if not _is_num(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", f"min_p must be in [0, 1], got {self.min_p!r}")
        if not _is_num(self.repetition_penalty) or not MIN_PENALTY <= self.repetition_penalty <= MAX_PENALTY:
            bad("repetition_penalty", f"repetition_penalty must be in [{MIN_PENALTY}, {MAX_PENALTY}], "
                                      f"got {self.repetition_penalty!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", f"stop must be a list of non-empty strings, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, list) or not all(_is_int(t) and 0 <= t < 2**63
                                                                for t in self.stop_token_ids):
            bad("stop_token_ids", f"stop_token_ids must be a list of non-negative integers, "
                                  f"got {self.stop_token_ids!r}")
        if self.seed is not None and (not _is_int(self.seed) or not -2**63 <= self.seed < 2**63):
            bad("seed", f"seed must be a 64-bit integer or None, got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            bad("logprobs", f"logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, "
                            f"got {self.logprobs!r}")
        if self.lora is not None and not isinstance(self.lora, LoraRequest):
            bad("lora", f"lora must be {{name, path, scale}} or None, got {type(self.lora).__name__}")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                bad("structured_outputs", "structured_outputs must be StructuredOutputsParams, a dict or None, "
                                          f"got {type(self.structured_outputs).__name__}")
            elif _is_int(self.min_tokens) and self.min_tokens > 0:
                bad("min_tokens", "min_tokens cannot be combined with structured_outputs (the grammar decides "
                                  "where EOS may come)")
        return p

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, fallback: dict[str, Any] | None = None) -> SamplingParams:
        """Build from a mapping (deploy `default_sampling_params`, request bodies); unknown keys are an error.

        `fallback` holds values for fields that `values` leaves unset, in place of the class
        defaults (a route's own default, e.g. chat's unbounded `max_tokens`). They stay unset,
        so the stage's deploy defaults, filled in the engine, still win over them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise RequestError(unknown[0], f"unknown SamplingParams field(s) {unknown}; "
                                           f"valid fields: {sorted(known)}")
        if not fallback:
            return cls(**values)
        return cls._built({**fallback, **values}, frozenset(values))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def admit(request_id: str, params: "SamplingParams | None", default: "SamplingParams", num_prompt: int,
          max_model_len: int, *, min_output_tokens: int = 0) -> "SamplingParams":
    """The request's params over the stage defaults (field by field: `with_defaults`), after the
    checks every AR backend makes before queueing: a non-empty prompt that, with `max_tokens`,
    fits `max_model_len`. Raises ValueError naming the numbers (TypeError for params of the
    wrong kind)."""
    if params is None:
        params = default
    elif isinstance(params, SamplingParams):
        params = params.with_defaults(default)
    if not isinstance(params, SamplingParams):
        raise TypeError(f"AR request params must be SamplingParams or None, got {type(params).__name__}")
    if num_prompt == 0:
        raise ValueError(f"request {request_id!r}: the prompt is empty")
    if num_prompt > max_model_len:
        raise ValueError(f"request {request_id!r}: prompt has {num_prompt} tokens, more than "
                         f"max_model_len={max_model_len}")
    if num_prompt + min_output_tokens > max_model_len:
        raise ValueError(f"request {request_id!r}: prompt has {num_prompt} tokens; max_model_len={max_model_len} "
                         "leaves no room for an output token")
    if params.max_tokens is not None and num_prompt + params.max_tokens > max_model_len:
        raise ValueError(f"request {request_id!r}: prompt ({num_prompt} tokens) + max_tokens ({params.max_tokens}) "
                         f"= {num_prompt + params.max_tokens} exceeds max_model_len={max_model_len}")
    return params
