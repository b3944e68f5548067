"""The TTS recipe: an AR talker that emits codec frames -> a codec (or VAE) decoder, streamed in chunks.

    stage 0 "talker" (ar)          prompt -> frames: one frame per engine step (a backbone, and
                                   where the model has one, a code predictor / depth decoder or
                                   a flow-matching head for the rest of the frame)
    stage 1 "codec"  (generation)  frames -> audio, one stream per request, fed chunk by chunk

A family declares its recipe (`TalkerCodec`: its two registered models, the talker's sampling
defaults, its chunking defaults) and gets its stages; what is its own stays in its folder:
the talker's `forward` / `on_sampled`, its prompt, its codec's `decode`. The pieces every
talker and codec shares live here, one job a module:

- `frames.FrameBuffer` and `frames.frame_extras`: the frames a talker has made, and what each
  step tells the chunker (`extras["audio_codes"]`, `extras["num_new_frames"]`);
- `chunks.FrameChunkParams` and `chunks.FrameChunks`: how those frames are cut into codec
  chunks (run by the orchestrator; torch-free);
- `side_sampling.SideRow`: how a code predictor samples the frame's other codebooks with
  the request's seed and temperature, without the rules of the talker's own token stream;
- `window.ContextWindow`: a non-causal or causal codec decoder's stream, voiced with left
  context (and a lookahead where it needs one), so chunked audio equals the one-shot decode.
- `request.speech_request` / `text_to_speak` and `reference_clip`: the opening of every
  family's request parsing, and the voice-cloning fields.

Qwen3-Omni's talker -> code2wav edge is the same recipe behind a thinker (its own
three-stage spec uses `FrameChunks` and the talker pieces). Torch-free at import.
"""

from omnistage.models.talker_codec.chunks import FrameChunkParams, FrameChunks
from omnistage.models.talker_codec.recipe import CODEC, TALKER, TalkerCodec

__all__ = ["CODEC", "TALKER", "FrameChunkParams", "FrameChunks", "TalkerCodec"]
