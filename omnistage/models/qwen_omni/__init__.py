"""What the Qwen omni families (Qwen2.5-Omni, Qwen3-Omni) share: one recipe, two checkpoints.

    thinker (ar) ──hidden states, streamed──> talker (ar) ──codes, streamed──> vocoder (generation)

- `handoff`: the thinker's inputs (the voice, and the request for what the talker reads),
  the streamed talker's pass-through input, the whole hand-off variant, the thinker-only
  variant and when it applies, the voice check;
- `media`: how a thinker lays out and encodes a prompt's audio, images and videos, and the
  checkpoint's image processor;
- `video`: video input on the PIL/numpy path (no torchvision).

What differs stays in each family's folder: the talker prompt each builds from the thinker's
rows, its vocoder, its default voice. Torch-free at import.
"""
