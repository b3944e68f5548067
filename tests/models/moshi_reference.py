"""The reference for Moshi's duplex loop, from transformers' own modules.

`MoshiForConditionalGeneration.generate` takes the user's audio only as a prompt, teacher-
forced together with Moshi's own audio and text, and then hears silence: it cannot take a
user stream that goes on while Moshi speaks. This loop is what `generate` does per
position, written with the same calls, with the user's stream in the user channel:

- the user's codes: `audio_encoder.encode` of the whole clip (one shot), after the
  unconditional start (`get_unconditional_inputs`: BOS), then the silent frame's codes
  (`generate`'s `blank_user_audio_codes`), delayed by `build_delay_pattern_mask`;
- Moshi's codes: the depth decoder's, through `apply_delay_pattern_mask` as in
  `prepare_inputs_for_generation`;
- each position: `_prepare_inputs_embeds_for_generation` -> `decoder` (its cache carried)
  -> greedy text token -> `depth_decoder.generate` with `generate`'s depth settings;
- the audio: the codes with the delay reverted as at the end of `generate`, decoded by
  `audio_encoder.decode`.

With a silent (empty) clip it is `generate` itself (tests/models/test_moshi.py checks).
"""

from __future__ import annotations

import numpy as np
import torch


@torch.inference_mode()
def reference_duplex(model, audio: np.ndarray, num_steps: int) -> tuple[list[int], torch.Tensor, np.ndarray]:
    """(text tokens, audio codes [frames, 8], waveform) for `num_steps` greedy positions."""
    from transformers import DynamicCache

    nq, bos = model.num_codebooks, model.config.audio_vocab_size
    frame = int(model.config.sampling_rate / model.config.audio_encoder_config.frame_rate)
    blank = model.audio_encoder.encode(torch.zeros(1, 1, frame), num_quantizers=nq)[0]
    clip = torch.as_tensor(audio, dtype=torch.float32)[None, None]
    user = model.audio_encoder.encode(clip, num_quantizers=nq)[0] if clip.numel() else blank[:, :, :0]
    start = model.get_unconditional_inputs()
    stream = torch.cat([start.user_audio_codes, user, blank.repeat(1, 1, num_steps)], dim=2)[:, :, :num_steps]
    user_in, _ = model.build_delay_pattern_mask(stream, bos_token_id=bos, pad_token_id=bos, max_length=num_steps + 1)
    _, moshi_mask = model.build_delay_pattern_mask(start.moshi_audio_codes, bos_token_id=bos, pad_token_id=bos,
                                                   max_length=num_steps + 1)
    generated = start.moshi_audio_codes
    text = start.input_ids
    depth_kwargs = {"min_length": nq + 1, "max_length": nq + 1, "cache_implementation": "static", "do_sample": False}
    cache = DynamicCache(config=model.config)
    tokens = []
    for p in range(num_steps):
        embeds = model._prepare_inputs_embeds_for_generation(
            text, moshi_audio_codes=generated[:, :, -1:], user_audio_codes=user_in[:, :, p:p + 1])[0]
        out = model.decoder(inputs_embeds=embeds, cache=cache, use_cache=True)
        text = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(text))
        codes = model.depth_decoder.generate(last_hidden_state=out.last_hidden_state[:, -1:], input_ids=text,
                                             **depth_kwargs)[:, 1:, None]
        generated = model.apply_delay_pattern_mask(torch.cat([generated, codes], dim=2), moshi_mask)
    mask = moshi_mask != bos
    codes = generated[mask].reshape(1, nq, -1)
    waveform = model.audio_encoder.decode(codes).audio_values[0, 0].numpy()
    return tokens, codes[0].T, waveform
