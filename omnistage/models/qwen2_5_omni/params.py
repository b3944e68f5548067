"""Request params of the token2wav stage (torch-free: users and the server import it cheaply).

    omni.generate(prompt, {"thinker": SamplingParams(max_tokens=64),
                           "token2wav": Token2WavParams(seed=0, chunk_size=0)})

The voice is not a param: it is part of the prompt (`{"messages": [...], "voice": "Ethan"}`),
because the thinker, the talker and token2wav all read it.

NOTE: these are read by the talker's chunk processor, which runs in the orchestrator and
copies them into every chunk's options; a request without them gets these defaults. The
token2wav stage's deploy `default_sampling_params` do not reach the orchestrator, so they
cannot set them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_CHUNK_SIZE = 36
"""Codec frames per streamed chunk (0.72 s at 50 frames/s): 3 DiT blocks of 12 frames."""
DEFAULT_LEFT_CONTEXT = 24
"""Codec frames already sent that each chunk's DiT pass sees again (2 blocks)."""
DEFAULT_RIGHT_CONTEXT = 12
"""Codec frames after a chunk that its DiT pass waits for (1 block of look-ahead)."""
DEFAULT_FIRST_CHUNK_SIZE = 12
"""Codec frames of the first chunk (0.24 s, one DiT block): first audio after 12 + 12 frames, not 36 + 12."""


class Token2WavParams(BaseModel):
    """How token2wav turns a request's codec frames into a waveform.

    Chunking: with `chunk_size > 0` the talker's codes go to token2wav in chunks of that
    many frames (the first one `first_chunk_size`) as soon as `right_context` more frames
    exist, so audio starts before the talker finishes; each chunk's DiT pass sees `left_context` frames before it and
    `right_context` after it, with the same noise the whole-utterance decode would use.
    The DiT attends across the whole utterance, so a chunked decode approximates the
    one-shot one. `chunk_size=0` decodes the whole utterance in one pass once the talker
    has finished: exactly transformers' `Qwen2_5OmniForConditionalGeneration.generate`.
    `chunk_size` and `left_context` must be multiples of the DiT block (12 frames in the
    released model), checked by the decoder.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_steps: int = Field(default=10, ge=2, le=100)
    """ODE (Runge-Kutta 4) time points of the DiT's flow matching; the reference default is 10."""
    guidance_scale: float = Field(default=0.5, ge=0)
    """Classifier-free guidance on the codes and speaker; 0 = no guidance pass."""
    sway_coefficient: float = -1.0
    """Sway sampling of the ODE time points (reference default -1)."""
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    """Seeds the DiT's initial noise (as `torch.manual_seed(seed)` before the reference's decode);
    None = a seed derived from the request id."""
    chunk_size: int = Field(default=DEFAULT_CHUNK_SIZE, ge=0)
    first_chunk_size: int = Field(default=DEFAULT_FIRST_CHUNK_SIZE, ge=0)
    """Frames of the first chunk only (0 = chunk_size): the default 12 (one DiT block) starts the
    audio after 24 frames instead of 48, at some cost in how closely the streamed waveform follows
    the one-shot decode, and one more DiT pass per utterance (benchmarks/bench_omni.py measures
    both). A multiple of the DiT block as well."""
    left_context: int = Field(default=DEFAULT_LEFT_CONTEXT, ge=0)
    right_context: int = Field(default=DEFAULT_RIGHT_CONTEXT, ge=0)
    first_right_context: int | None = Field(default=None, ge=0)
    """Look-ahead frames the first chunk waits for (None = right_context, at most that): 0 sends the
    first chunk as soon as its own frames exist, so first audio comes 12 talker steps and a smaller
    DiT window sooner, but its last block is decoded without the block after it (a larger seam error;
    benchmarks/bench_omni.py measures it)."""

    @model_validator(mode="after")
    def _first_right_context_at_most_right_context(self) -> Token2WavParams:
        if self.first_right_context is not None and self.first_right_context > self.right_context:
            raise ValueError(f"first_right_context ({self.first_right_context}) must be at most right_context "
                             f"({self.right_context})")
        return self
