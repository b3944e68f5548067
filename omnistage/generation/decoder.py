"""The seam between the generation engine and a model family's single-pass decoder.

A `Decoder` turns frames of codes (a codec's tokens, a talker's codes) into audio, one
batched pass per engine step. It decodes *streams*: each stream is opened once, then
fed consecutive chunks of frames, and the decoder carries whatever state makes chunk
after chunk sound like one decode (a KV cache, convolution left context, overlap-add
tails). A stateless decoder returns None from `open_stream` and ignores the states.

Families register their decoder under the key their `StageSpec.model` names, from their
(torch-free) package `__init__.py`:

    register_decoder("qwen2_5_omni.token2wav", "omnistage.models.qwen2_5_omni.token2wav:Token2Wav")

Built in: "mimi" (generation/mimi.py), the Mimi codec of a Mimi or CSM checkpoint.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from omnistage.config.registry import REGISTRY
from omnistage.core.registry import ComponentRegistry

if TYPE_CHECKING:
    import numpy as np
    import torch

    from omnistage.config.spec import StageSpec


class Decoder(ABC):
    sample_rate: int = 0
    chunk_frames: int | None = None
    """Frames one stream decodes per step (a whole request is streamed out in pieces of this); None = all pending."""
    max_frames: int | None = None
    """Most frames one stream may hold in total (e.g. a KV cache's length); None = unbounded."""
    supports_prepacked_linears: bool = False
    """`model`'s code only calls its linear layers (never reads their `.weight`), so on CPU the
    engine may swap them for oneDNN ones with prepacked weights (core/cpu_linear.py)."""
    model: Any = None
    """The decoder's torch module (None once closed)."""

    @classmethod
    @abstractmethod
    def load(cls, model_path: str, stage: StageSpec | None, device: torch.device, dtype: torch.dtype,
             max_streams: int) -> Decoder:
        """Load weights; at most `max_streams` streams will be open at once."""

    @abstractmethod
    def parse(self, codes: Any) -> torch.Tensor:
        """Validate one request's codes (tensor, array or nested list) -> a tensor whose dim 0 is frames.
        Raise ValueError naming the problem (shape, range)."""

    def open_stream(self, options: Any = None) -> Any:
        """Per-stream state for a new stream (None for a stateless decoder). `options` are the
        stream's `inputs["options"]` (decoder-specific, e.g. a voice); a stream without options
        is opened with no argument, so decoders that take none need not accept it."""
        return None

    def close_stream(self, state: Any) -> None:
        """The stream ended or was aborted: free what `open_stream` took."""

    def flush(self, state: Any) -> np.ndarray:
        """The stream's last frames have all been decoded: the audio it held back, if any (a
        non-causal decoder keeps a lookahead of frames unvoiced until it sees the ones after)."""
        import numpy as np

        return np.zeros(0, dtype=np.float32)

    @abstractmethod
    def decode(self, codes: list[torch.Tensor], states: list[Any]) -> list[np.ndarray]:
        """One batched pass: row i continues stream `states[i]` with frames `codes[i]` -> float32 mono audio."""

    def close(self) -> None:
        """Free weights and buffers."""


# --- registry --------------------------------------------------------------------------

_DECODERS = ComponentRegistry("decoder", REGISTRY.discover, builtins={"mimi": "omnistage.generation.mimi:MimiDecoder"})


def register_decoder(key: str, target: str | type[Decoder]) -> None:
    """Run generation stages whose `StageSpec.model == key` on `target` (a Decoder subclass or "module:Class")."""
    _DECODERS.register(key, target)


def get_decoder_class(key: str | None) -> type[Decoder]:
    if key is None:
        raise ValueError("a generation stage needs StageSpec.model naming its decoder; "
                         f"registered: {_DECODERS.keys()}")
    return _DECODERS.get(key)
