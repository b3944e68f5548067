"""Single-pass decoders (vocoders, codec decoders): batched and chunk-streaming.

Exports are lazy so that importing the package does not import torch.
"""

from __future__ import annotations

from omnistage.lazy import lazy_getattr

_EXPORTS = {
    "GenerationEngine": "omnistage.generation.engine",
    "Decoder": "omnistage.generation.decoder",
    "register_decoder": "omnistage.generation.decoder",
    "get_decoder_class": "omnistage.generation.decoder",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
