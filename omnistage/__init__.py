"""omnistage: serve omni-modality models (text, image, video, audio) behind one API.

    from omnistage import Omni, DiffusionParams
    with Omni("path/to/model") as omni:
        out = omni.generate("a cat", DiffusionParams(num_inference_steps=4))[0]

The exports are lazy (module `__getattr__`): `import omnistage` imports neither torch nor
the engines; the first use of a name imports its module.
"""

from __future__ import annotations

from omnistage.lazy import lazy_getattr
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "Omni": "omnistage.entrypoints.omni",
    "AsyncOmni": "omnistage.entrypoints.omni",
    "OmniRequestError": "omnistage.entrypoints.omni",
    "OmniOutput": "omnistage.engine.outputs",
    "DiffusionParams": "omnistage.diffusion.params",
    "SamplingParams": "omnistage.ar.sampling_params",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from omnistage.ar.sampling_params import SamplingParams
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.engine.outputs import OmniOutput
    from omnistage.entrypoints.omni import AsyncOmni, Omni, OmniRequestError


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
