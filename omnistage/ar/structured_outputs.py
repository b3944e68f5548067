"""Structured outputs: a grammar (JSON schema, any JSON object, regex, choice, Lark) that
every sampled token must follow, applied as a logits mask in the sampler.

    StructuredOutputsParams   what the request asks for (vLLM's field names; plain Python)
    GrammarCompiler           one per engine: the tokenizer's token trie, built once
    Grammar                   one per sequence: which tokens may come next, fed each sampled token

The engine is llguidance (Microsoft's, the one vLLM and SGLang ship as a backend): a
dependency-free abi3 wheel (no torch pin, no compiler, works on CPU), built from a
`tokenizers` JSON, so any fast tokenizer works, and it compiles a schema lazily, so the
first mask costs milliseconds rather than a full automaton build. xgrammar needs triton
and its own torch pin; outlines-core builds the whole index up front.

When the grammar is complete, llguidance allows only EOS: the sequence stops the usual
way. Until then EOS is masked, so a length stop is the only way to get partial output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omnistage.core.errors import RequestError

_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass
class StructuredOutputsParams:
    """Exactly one of the fields below (vLLM's `StructuredOutputsParams`)."""

    json: dict[str, Any] | str | None = None
    """A JSON schema (dict or its JSON text): the output is one JSON value valid against it."""
    json_object: bool | None = None
    """True: the output is any JSON object."""
    regex: str | None = None
    """The output matches this regular expression (whole)."""
    choice: list[str] | None = None
    """The output is exactly one of these strings."""
    grammar: str | None = None
    """A Lark grammar (llguidance's dialect; `start` is the start rule)."""

    def __post_init__(self) -> None:
        given = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise RequestError("structured_outputs",
                               f"structured_outputs: needs exactly one of {', '.join(_KINDS)}; got {given or 'none'}")
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except ValueError as e:
                raise RequestError("structured_outputs.json",
                                   f"structured_outputs.json: not valid JSON ({e})") from None
        if self.json is not None and not isinstance(self.json, dict):
            raise RequestError("structured_outputs.json",
                               f"structured_outputs.json must be a JSON schema object, got {type(self.json).__name__}")
        if self.json_object not in (None, True, False):
            raise RequestError("structured_outputs.json_object",
                               f"structured_outputs.json_object must be a bool, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise RequestError(f"structured_outputs.{name}",
                                   f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None and (not isinstance(self.choice, list) or not self.choice
                                        or not all(isinstance(c, str) and c for c in self.choice)):
            raise RequestError("structured_outputs.choice", "structured_outputs.choice must be a non-empty list of "
                                                            f"non-empty strings, got {self.choice!r}")

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> StructuredOutputsParams:
        unknown = sorted(set(values) - set(_KINDS))
        if unknown:
            raise RequestError("structured_outputs",
                               f"structured_outputs: unknown field(s) {unknown}; valid fields: {list(_KINDS)}")
        return cls(**values)

    def validate(self) -> None:
        """Compile the grammar without a tokenizer (cheap: the edge checks it before queueing);
        ValueError naming the problem."""
        from llguidance import LLMatcher

        try:
            grammar = self.to_llguidance()
        except ValueError as e:
            raise RequestError(f"structured_outputs.{self.kind}", f"structured_outputs.{self.kind}: {e}") from None
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, None)
        if is_error:
            raise RequestError(f"structured_outputs.{self.kind}",
                               f"structured_outputs.{self.kind}: invalid grammar: {messages[0]}")

    def to_llguidance(self) -> str:
        """The grammar in llguidance's serialized form."""
        from llguidance import LLMatcher

        if self.json is not None:
            return LLMatcher.grammar_from_json_schema(self.json, defaults={"whitespace_flexible": False})
        if self.json_object:
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults={"whitespace_flexible": False})
        if self.regex is not None:
            return LLMatcher.grammar_from_regex(self.regex)
        if self.choice is not None:
            return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in self.choice))
        return LLMatcher.grammar_from_lark(self.grammar)


class GrammarCompiler:
    """Builds per-request `Grammar`s for one tokenizer (the trie is built on first use, ~0.1-1 s)."""

    def __init__(self, tokenizer: Any, eos_token_ids: tuple[int, ...]) -> None:
        self._hf_tokenizer = tokenizer
        self._eos = list(eos_token_ids)
        self._ll_tokenizer: Any = None

    @property
    def ll_tokenizer(self) -> Any:
        if self._ll_tokenizer is None:
            import llguidance.hf

            self._ll_tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=len(self._hf_tokenizer),
                                                              eos_token=self._eos or None)
        return self._ll_tokenizer

    def compile(self, params: StructuredOutputsParams) -> Grammar:
        """A fresh matcher for one sequence; ValueError naming the problem when the grammar is invalid."""
        from llguidance import LLMatcher

        try:
            grammar = params.to_llguidance()
        except ValueError as e:
            raise RequestError(f"structured_outputs.{params.kind}", f"structured_outputs.{params.kind}: {e}") from None
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise RequestError(f"structured_outputs.{params.kind}",
                               f"structured_outputs.{params.kind}: invalid grammar: {messages[0]}")
        matcher = LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RequestError(f"structured_outputs.{params.kind}",
                               f"structured_outputs.{params.kind}: invalid grammar: {matcher.get_error()}")
        return Grammar(matcher, len(self._hf_tokenizer))


class Grammar:
    """One sequence's matcher: the mask of allowed next tokens, advanced by each sampled token."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    @property
    def is_active(self) -> bool:
        """False once the matcher errs (it then allows nothing; the sampler stops masking)."""
        return not self.matcher.is_error()

    def bitmask(self) -> bytes:
        """Allowed next tokens, one bit per token id (little-endian 32-bit words)."""
        return self.matcher.compute_bitmask()

    def accept(self, token_id: int) -> None:
        self.matcher.consume_token(token_id)

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()
