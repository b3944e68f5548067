"""How a Qwen omni thinker lays out and encodes a prompt's media (shared by Qwen2.5-Omni and Qwen3-Omni).

`OmniMedia._encode_media` walks the prompt's placeholders in order and asks the thinker's
own encoders for each kind: one <|AUDIO|> per audio frame, one <|IMAGE|> / <|VIDEO|> per
merged patch, and with `use_audio_in_video` a video's frame tokens interleaved with its own
audio's (the family's `_interleave`: Qwen2.5-Omni in 2-second chunks, Qwen3-Omni by time),
between <|audio_bos|> and <|audio_eos|>, as the families' processors do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.models.chat_media import ChatMedia

AUDIO_SAMPLE_RATE = 16000  # the Whisper feature extractor's input rate


@dataclass
class MediaPrompt:
    """A prompt's ids with its media encoded (built by `OmniMedia._encode_media`)."""

    ids: list[int]
    embeds: dict[int, torch.Tensor] = field(default_factory=dict)
    audio_seqlens: torch.Tensor | None = None
    image_grid: torch.Tensor | None = None
    video_grid: torch.Tensor | None = None
    seconds_per_grid: torch.Tensor | None = None
    deepstack: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    """Placeholder id -> per deepstack layer, [its tokens, H] (thinkers with deepstack vision features)."""
    cache_ids: list | None = None
    """`ids` with each media position named by its media, `(id, digest)`: the prefix cache's keys."""


def media_digest(part: Any) -> str:
    """A digest of one media input's content (array, PIL image, bytes, or a video part's dict)."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)

    def feed(value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value):
                h.update(str(key).encode())
                feed(value[key])
        elif isinstance(value, (tuple, list)):
            for v in value:
                feed(v)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            h.update(value)
        elif hasattr(value, "__array_interface__") or isinstance(value, np.ndarray):  # PIL images too
            array = np.ascontiguousarray(np.asarray(value))
            h.update(f"{array.dtype}{array.shape}".encode())
            h.update(array.tobytes())
        else:
            h.update(repr(value).encode())

    feed(part)
    return h.hexdigest()


def prompt_options(inputs: Any, default_voice: str) -> tuple[Any, str | None, bool]:
    """The thinker's own prompt keys taken out: (the rest, the voice when a talker is downstream
    (None otherwise), `use_audio_in_video`)."""
    if not isinstance(inputs, dict) or not ({"voice", "use_audio_in_video"} & inputs.keys()):
        return inputs, None, False
    inputs = dict(inputs)
    voice = (inputs.pop("voice") or default_voice) if "voice" in inputs else None
    return inputs, voice, bool(inputs.pop("use_audio_in_video", False))


def joint_deepstack(prompt: MediaPrompt, tokens: tuple[int, ...]) -> list[torch.Tensor] | None:
    """Per deepstack layer, the features of every visual position (of any of `tokens`) in prompt
    order, as the language model adds them; None when no vision encoder ran."""
    if not prompt.deepstack:
        return None
    ids = torch.tensor(prompt.ids)
    visual = ids[torch.isin(ids, torch.tensor(tokens))]
    num_layers = len(next(iter(prompt.deepstack.values())))
    layers = []
    for k in range(num_layers):
        any_layer = next(iter(prompt.deepstack.values()))[k]
        joint = any_layer.new_zeros(len(visual), any_layer.shape[-1])
        for token, features in prompt.deepstack.items():
            joint[(visual == token).to(joint.device)] = features[k]
        layers.append(joint)
    return layers


class OmniMedia:
    """Mixin for a thinker with `audio_token_id`, `image_token_id`, `video_token_id`,
    `audio_bos_id`, `audio_eos_id`, `feature_extractor`, `image_processor`, `encoder_cache`,
    `video_rules`, `model` and `device`; the family gives `audio_feature_kwargs` (its processor's padding),
    `_audio_token_counts(seqlens)` and `_interleave(times, num_audio)`."""

    def _encode_media(self, ids: list[int], media: ChatMedia, with_audio: bool) -> MediaPrompt:
        """Encode every media part and lay its placeholder out as the processor does: one
        <|AUDIO|> per audio frame, one <|IMAGE|> / <|VIDEO|> per merged patch, and with
        `use_audio_in_video` a video's frame and audio tokens interleaved in 2-second chunks."""
        from omnistage.models.qwen2_5_omni.video import read_clip

        slots = [t for t in ids if t in (self.audio_token_id, self.image_token_id, self.video_token_id)]
        for token, parts, kind in ((self.audio_token_id, media.audios, "audio"), (self.image_token_id, media.images,
                                   "image"), (self.video_token_id, media.videos, "video")):
            if slots.count(token) != len(parts):
                raise ValueError(f"the prompt has {slots.count(token)} {kind} placeholders but {len(parts)} {kind} inputs")
        temporal = self.image_processor.temporal_patch_size if self.image_processor is not None else 2
        clips = [read_clip(part, self.video_rules, temporal, with_audio) for part in media.videos]
        # Audio features in the order their tokens come: audio parts and videos' own audio.
        audio_parts, videos_left = iter(media.audios), iter(clips)
        heard = [next(audio_parts) if t == self.audio_token_id else next(videos_left).audio
                 for t in slots if t == self.audio_token_id or (t == self.video_token_id and with_audio)]
        prompt = MediaPrompt(ids)
        heard_counts = iter(self._encode_audio(prompt, heard) if heard else [])
        audio_counts, video_audio_counts = [], []  # per audio part; per video's own audio
        for t in slots:
            if t == self.audio_token_id:
                audio_counts.append(next(heard_counts))
            elif t == self.video_token_id and with_audio:
                video_audio_counts.append(next(heard_counts))
        image_counts = self._encode_images(prompt, media.images) if media.images else []
        video_layouts = self._encode_videos(prompt, clips, video_audio_counts) if clips else []
        audio_counts, image_counts, layouts = iter(audio_counts), iter(image_counts), iter(video_layouts)
        digests = {self.audio_token_id: iter(media.audios), self.image_token_id: iter(media.images),
                   self.video_token_id: iter(media.videos)}
        expanded: list[int] = []
        keys: list = []
        for t in ids:
            if t == self.audio_token_id:
                span = [t] * next(audio_counts)
            elif t == self.image_token_id:
                span = [t] * next(image_counts)
            elif t == self.video_token_id:
                span = next(layouts)
            else:
                expanded.append(t)
                keys.append(t)
                continue
            # Every placeholder id is the same for all media: the cache keys name the media too.
            digest = media_digest((next(digests[t]), with_audio))
            expanded += span
            keys += [(k, digest) for k in span]
        prompt.ids, prompt.cache_ids = expanded, keys
        return prompt

    def _encode_audio(self, prompt: MediaPrompt, audios: list[tuple[Any, int]]) -> list[int]:
        """The clips through the Whisper features (the family's `audio_feature_kwargs`) and the audio
        encoder; returns each clip's token count."""
        from omnistage.media.audio import resample

        if self.feature_extractor is None:
            raise ValueError("this checkpoint has no audio feature extractor (preprocessor_config.json)")
        waves = [resample(audio, rate, AUDIO_SAMPLE_RATE) for audio, rate in audios]
        features = self.feature_extractor(waves, sampling_rate=AUDIO_SAMPLE_RATE, return_attention_mask=True,
                                          return_tensors="pt", **self.audio_feature_kwargs)
        mask = features["attention_mask"].to(self.device)
        prompt.audio_seqlens = mask.sum(-1)
        features = features["input_features"].to(self.device, self.model.dtype)
        prompt.embeds[self.audio_token_id] = self.model.get_audio_features(features, mask).last_hidden_state
        return self._audio_token_counts(prompt.audio_seqlens)

    def _encode_images(self, prompt: MediaPrompt, images: list[Any]) -> list[int]:
        """Pixels by the checkpoint's image processor (PIL path), one placeholder per merged patch.
        Images encoded before (`encoder_cache`, by digest) are not encoded again."""
        from types import SimpleNamespace

        from omnistage.models.qwen2_5_omni.encoder_cache import EncodedImage

        if self.image_processor is None:
            raise ValueError("this checkpoint has no image processor (preprocessor_config.json image fields)")
        digests = [media_digest(image) for image in images]
        missing = list(dict.fromkeys(d for d in digests if self.encoder_cache.get(d) is None))
        if missing:
            first = {d: images[digests.index(d)] for d in missing}
            pixels = self.image_processor(images=list(first.values()), return_tensors="pt")
            grids = pixels["image_grid_thw"].to(self.device)
            out = self.model.get_image_features(pixels["pixel_values"].to(self.device, self.model.dtype), grids)
            deep = getattr(out, "deepstack_features", None)
            for j, digest in enumerate(missing):
                self.encoder_cache.put(digest, EncodedImage(grids[j], out.pooler_output[j],
                                                            [layer[j] for layer in deep] if deep else None))
        entries = [self.encoder_cache.get(d) for d in digests]
        prompt.image_grid = torch.stack([e.grid for e in entries])
        deep = None if entries[0].deepstack is None else [[e.deepstack[k] for e in entries]
                                                          for k in range(len(entries[0].deepstack))]
        self._store_features(prompt, self.image_token_id,
                             SimpleNamespace(pooler_output=[e.features for e in entries], deepstack_features=deep))
        return (prompt.image_grid.prod(-1) // self.image_processor.merge_size ** 2).tolist()

    def _store_features(self, prompt: MediaPrompt, token: int, out: Any) -> None:
        """A vision encoder output for `token`'s positions (a deepstack thinker also keeps its layers)."""
        prompt.embeds[token] = torch.cat(out.pooler_output)

    def _encode_videos(self, prompt: MediaPrompt, clips: list, audio_counts: list[int]) -> list[list[int]]:
        """Each clip's pixels (`video_pixels`) through the vision encoder; returns each video's tokens,
        its frames' interleaved with its own audio's (`audio_counts`, one per clip) when it is heard."""
        from omnistage.models.qwen2_5_omni.video import frame_positions, video_pixels

        if self.image_processor is None:
            raise ValueError("this checkpoint has no image processor (preprocessor_config.json image fields)")
        rules = self.video_rules
        pixels, grids = zip(*(video_pixels(self.image_processor, clip.frames, rules) for clip in clips))
        prompt.video_grid = torch.tensor(grids, device=self.device)
        prompt.seconds_per_grid = torch.tensor([clip.seconds_per_grid for clip in clips])
        values = torch.from_numpy(np.concatenate(pixels)).to(self.device, self.model.dtype)
        self._store_features(prompt, self.video_token_id, self.model.get_video_features(values, prompt.video_grid))
        merge = self.image_processor.merge_size
        if not audio_counts:
            return [[self.video_token_id] * (t * h * w // merge**2) for t, h, w in grids]
        tokens = {"video": self.video_token_id, "audio": self.audio_token_id}
        layouts = []
        for grid, clip, num_audio in zip(grids, clips, audio_counts):
            times = frame_positions(grid, merge, clip.seconds_per_grid, rules.position_id_per_seconds)
            order = self._interleave(times, num_audio)
            layouts.append([self.audio_bos_id, *(tokens[k] for k in order), self.audio_eos_id])
        return layouts
