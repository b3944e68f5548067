"""Single-pass decoders (vocoders, codec decoders): batched and chunk-streaming.

Exports are lazy so that importing the package does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "GenerationEngine": "omnistage.generation.engine",
    "Decoder": "omnistage.generation.decoder",
    "register_decoder": "omnistage.generation.decoder",
    "get_decoder_class": "omnistage.generation.decoder",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
