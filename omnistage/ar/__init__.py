"""Continuous-batching engine for autoregressive stages.

Exports are lazy so that `from omnistage.ar import SamplingParams` (and the package
itself) does not import torch.
"""

from __future__ import annotations

from omnistage.lazy import lazy_getattr

_EXPORTS = {
    "SamplingParams": "omnistage.ar.sampling_params",
    "AREngine": "omnistage.ar.engine",
    "ARModel": "omnistage.ar.model",
    "ModelInput": "omnistage.ar.model",
    "ModelOutput": "omnistage.ar.model",
    "PromptInputs": "omnistage.ar.model",
    "register_ar_model": "omnistage.ar.model",
    "get_ar_model_class": "omnistage.ar.model",
    "HFCausalLM": "omnistage.ar.hf_model",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
