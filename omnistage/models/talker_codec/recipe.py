"""The recipe's two stages, as a family declares them (see the package docstring).

    TALKER_CODEC = TalkerCodec(talker="csm.talker", codec="mimi", sampling=TALKER_SAMPLING,
                               chunking=CsmCodecParams())
    CSM = PipelineSpec(name="csm", stages=TALKER_CODEC.stages(), request_extras={...})

The family still registers its models and its pipeline itself, next to the declaration.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnistage.config import StageSpec
from omnistage.models.talker_codec.chunks import FrameChunkParams, FrameChunks

TALKER, CODEC = 0, 1


@dataclass(frozen=True)
class TalkerCodec:
    """talker (ar, frames out) -> codec (generation, audio out), the frames streamed in chunks."""

    talker: str
    """The talker's AR model key (`register_ar_model`)."""
    codec: str
    """The codec's decoder key (`register_decoder`)."""
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """The talker's default sampling params (the reference's; a bare request's length cap)."""
    chunking: FrameChunkParams = FrameChunkParams()
    """What a request without codec params gets: the family's chunk sizes."""
    codec_name: str = "codec"
    """The codec stage's name: the key of its params in a request (`{"codec": ...}`)."""

    def stages(self) -> tuple[StageSpec, StageSpec]:
        return (
            StageSpec(id=TALKER, name="talker", kind="ar", output="tokens", model=self.talker,
                      chunk_processor=FrameChunks(CODEC, self.chunking),
                      defaults={"default_sampling_params": dict(self.sampling)}),
            StageSpec(id=CODEC, name=self.codec_name, kind="generation", output="audio", inputs=(TALKER,),
                      final_output=True, model=self.codec, stream_input=True),
        )
