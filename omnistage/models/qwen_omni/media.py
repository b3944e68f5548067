"""How a Qwen omni thinker lays out and encodes a prompt's media (shared by Qwen2.5-Omni and Qwen3-Omni).

`OmniMedia._prepare_media` walks the prompt's placeholders in order and prepares each kind
for the thinker's own encoders: one <|AUDIO|> per audio frame, one <|IMAGE|> / <|VIDEO|> per
merged patch, and with `use_audio_in_video` a video's frame tokens interleaved with its own
audio's (the family's `_interleave`: Qwen2.5-Omni in 2-second chunks, Qwen3-Omni by time),
between <|audio_bos|> and <|audio_eos|>, as the families' processors do. It also says where
each item's tokens sit and digests what it was made of (`MediaPrompt.spans`), so the prefix
cache can tell one image from another behind the same placeholder ids (ar/media_spans.py).
The encoders run at the first prefill (`_encode_fed`), on the items it feeds only: an item a
prefix-cache hit covers whole is never encoded. Images are also prepared there: admission needs
only each image's grid, which follows from its size (`image_grid`), so an image a hit covers
never goes through the image processor either (a video chat's buffered frames, query after query).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.ar.media_spans import MediaSpan, media_digest
from omnistage.models.chat_media import ChatMedia

AUDIO_SAMPLE_RATE = 16000  # the Whisper feature extractor's input rate


@dataclass
class MediaPrompt:
    """A prompt's ids with its media laid out and prepared for the encoders (built by
    `OmniMedia._prepare_media`); `OmniMedia._encode_fed` encodes it at the first prefill."""

    ids: list[int]
    spans: tuple[MediaSpan, ...] = ()
    """Each item's positions in `ids` and its digest, in prompt order (`PromptInputs.media`)."""
    audio_seqlens: torch.Tensor | None = None
    image_grid: torch.Tensor | None = None
    video_grid: torch.Tensor | None = None
    seconds_per_grid: torch.Tensor | None = None
    audio_inputs: tuple[torch.Tensor, torch.Tensor] | None = None
    """(features, mask) of every heard clip (audio parts and videos' own audio), in token order."""
    images: list[Any] = field(default_factory=list)
    """The image parts as given: the first prefill prepares the pixels of those it feeds (`_image_pixels`)."""
    video_pixels: list[torch.Tensor] = field(default_factory=list)
    owners: dict[str, list[int]] = field(default_factory=dict)
    """"audio" / "image" / "video" -> the item (index into `spans`) of each heard clip / image / video."""


def prompt_options(inputs: Any, default_voice: str) -> tuple[Any, str | None, bool]:
    """The thinker's own prompt keys taken out: (the rest, the voice when a talker is downstream
    (None otherwise), `use_audio_in_video`)."""
    if not isinstance(inputs, dict) or not ({"voice", "use_audio_in_video"} & inputs.keys()):
        return inputs, None, False
    inputs = dict(inputs)
    voice = (inputs.pop("voice") or default_voice) if "voice" in inputs else None
    return inputs, voice, bool(inputs.pop("use_audio_in_video", False))


def joint_deepstack(ids: list[int], deepstack: dict[int, list[torch.Tensor]],
                    tokens: tuple[int, ...]) -> list[torch.Tensor] | None:
    """Per deepstack layer, the features of every visual position (of any of `tokens`) of `ids` in
    order, as the language model adds them; None when no vision encoder ran."""
    if not deepstack:
        return None
    ids = torch.tensor(ids)
    visual = ids[torch.isin(ids, torch.tensor(tokens))]
    num_layers = len(next(iter(deepstack.values())))
    layers = []
    for k in range(num_layers):
        any_layer = next(iter(deepstack.values()))[k]
        joint = any_layer.new_zeros(len(visual), any_layer.shape[-1])
        for token, features in deepstack.items():
            joint[(visual == token).to(joint.device)] = features[k]
        layers.append(joint)
    return layers


class OmniMedia:
    """Mixin for a thinker with `audio_token_id`, `image_token_id`, `video_token_id`,
    `audio_bos_id`, `audio_eos_id`, `feature_extractor`, `image_processor`, `video_rules`, `model`
    and `device`; the family gives `audio_padding` (how far its processor pads a request's clips:
    "max_length" or "longest"), `_audio_token_counts(seqlens)` and `_interleave(times, num_audio)`."""

    def _prepare_media(self, ids: list[int], media: ChatMedia, with_audio: bool) -> MediaPrompt:
        """Prepare every media part for its encoder and lay its placeholder out as the processor does:
        one <|AUDIO|> per audio frame, one <|IMAGE|> / <|VIDEO|> per merged patch, and with
        `use_audio_in_video` a video's frame and audio tokens interleaved. The encoders run later,
        at the first prefill, on the items it feeds (`_encode_fed`)."""
        from omnistage.models.qwen_omni.video import read_clip

        kinds = {self.audio_token_id: "audio", self.image_token_id: "image", self.video_token_id: "video"}
        slots = [t for t in ids if t in kinds]
        for token, parts in ((self.audio_token_id, media.audios), (self.image_token_id, media.images),
                             (self.video_token_id, media.videos)):
            if slots.count(token) != len(parts):
                kind = kinds[token]
                raise ValueError(f"the prompt has {slots.count(token)} {kind} placeholders but {len(parts)} {kind} inputs")
        temporal = self.image_processor.temporal_patch_size if self.image_processor is not None else 2
        clips = [read_clip(part, self.video_rules, temporal, with_audio) for part in media.videos]
        # Audio in the order its tokens come: audio parts and videos' own audio; each slot is one item.
        heard_by = [i for i, t in enumerate(slots)
                    if t == self.audio_token_id or (t == self.video_token_id and with_audio)]
        audio_parts, videos_left = iter(media.audios), iter(clips)
        heard = [next(audio_parts) if slots[i] == self.audio_token_id else next(videos_left).audio for i in heard_by]
        prompt = MediaPrompt(ids, owners={"audio": heard_by, **{kind: [i for i, t in enumerate(slots) if t == token]
                                                                for token, kind in kinds.items() if kind != "audio"}})
        heard_clips = iter(self._prepare_audio(prompt, heard) if heard else [])
        audio_clips, video_audio_clips = [], []  # (tokens, padded length) per audio part; per video's own audio
        for i in heard_by:
            (audio_clips if slots[i] == self.audio_token_id else video_audio_clips).append(next(heard_clips))
        image_counts = self._prepare_images(prompt, media.images) if media.images else []
        video_layouts = self._prepare_videos(prompt, clips, [n for n, _ in video_audio_clips]) if clips else []
        audio_counts, image_counts, layouts = iter(n for n, _ in audio_clips), iter(image_counts), iter(video_layouts)
        # What each item's features and token positions follow from: its samples (and the length
        # the processor padded them to, which the request's other clips set), its pixels, and for a
        # video its sampling and, when heard, its audio.
        video_audio = iter((*c.audio, length) for c, (_, length) in zip(clips, video_audio_clips))
        digests = {self.audio_token_id: iter(media_digest("audio", np.asarray(a), rate, length)
                                             for (a, rate), (_, length) in zip(media.audios, audio_clips)),
                   self.image_token_id: iter(media_digest("image", np.asarray(image)) for image in media.images),
                   self.video_token_id: iter(media_digest("video", c.frames, c.seconds_per_grid, with_audio,
                                                          *(next(video_audio) if with_audio else ())) for c in clips)}
        expanded: list[int] = []
        spans: list[MediaSpan] = []
        for t in ids:
            start = len(expanded)
            if t == self.audio_token_id:
                expanded += [t] * next(audio_counts)
            elif t == self.image_token_id:
                expanded += [t] * next(image_counts)
            elif t == self.video_token_id:
                expanded += next(layouts)
            else:
                expanded.append(t)
                continue
            spans.append(MediaSpan(start, len(expanded) - start, next(digests[t])))
        prompt.ids, prompt.spans = expanded, tuple(spans)
        return prompt

    def _prepare_audio(self, prompt: MediaPrompt, audios: list[tuple[Any, int]]) -> list[tuple[int, int]]:
        """The clips through the Whisper features, each padded as the family's processor pads it among
        the request's clips (`audio_padding`); returns each clip's token count and the length (in
        samples) its features were computed at, which its digest covers: a clip's last frames differ
        with the padding after it, so a clip padded otherwise is another item to the prefix cache."""
        from omnistage.media.audio import resample

        fe = self.feature_extractor
        if fe is None:
            raise ValueError("this checkpoint has no audio feature extractor (preprocessor_config.json)")
        waves = [resample(audio, rate, AUDIO_SAMPLE_RATE) for audio, rate in audios]
        padded = fe.n_samples if self.audio_padding == "max_length" else max(len(wave) for wave in waves)
        # Padding past the last frame's window changes none of the frames the mask keeps (past the clip
        # its samples are zeros either way, and a zero frame never sets the log-mel's maximum), and the
        # encoders read those frames only: so each clip is padded that far at most. Padding every clip
        # of a realtime turn (or a conversation's every turn) to 300 s cost ~0.3 s of CPU a clip.
        lengths = [min(padded, -(-(len(wave) + fe.n_fft) // fe.hop_length) * fe.hop_length) for wave in waves]
        outs = [fe(wave, sampling_rate=AUDIO_SAMPLE_RATE, return_attention_mask=True, return_tensors="pt",
                   padding="max_length", max_length=length) for wave, length in zip(waves, lengths)]
        width = max(out["input_features"].shape[-1] for out in outs)
        features = torch.zeros(len(outs), fe.feature_size, width)
        mask = torch.zeros(len(outs), width, dtype=torch.long)
        for i, out in enumerate(outs):
            n = out["input_features"].shape[-1]
            features[i, :, :n], mask[i, :n] = out["input_features"][0], out["attention_mask"][0]
        mask = mask.to(self.device)
        prompt.audio_seqlens = mask.sum(-1)
        prompt.audio_inputs = features.to(self.device, self.model.dtype), mask
        return list(zip(self._audio_token_counts(prompt.audio_seqlens), lengths))

    def _prepare_images(self, prompt: MediaPrompt, images: list[Any]) -> list[int]:
        """Each image's grid from its size (`image_grid`), one placeholder per merged patch; the pixels
        wait for the first prefill (`_image_pixels`), which skips the images a prefix-cache hit covers."""
        if self.image_processor is None:
            raise ValueError("this checkpoint has no image processor (preprocessor_config.json image fields)")
        prompt.image_grid = torch.tensor([image_grid(self.image_processor, image) for image in images],
                                         device=self.device)
        prompt.images = list(images)
        return (prompt.image_grid.prod(-1) // self.image_processor.merge_size ** 2).tolist()

    def _image_pixels(self, prompt: MediaPrompt, chosen: list[int]) -> torch.Tensor:
        """The pixels of images `chosen` by the checkpoint's image processor (PIL path), in order."""
        pixels = self.image_processor(images=[prompt.images[j] for j in chosen], return_tensors="pt")
        if not torch.equal(pixels["image_grid_thw"].to(prompt.image_grid.device), prompt.image_grid[chosen]):
            raise RuntimeError("the image processor's grids differ from those its resize rule gave at admission")
        return pixels["pixel_values"].to(self.device, self.model.dtype)

    def _prepare_videos(self, prompt: MediaPrompt, clips: list, audio_counts: list[int]) -> list[list[int]]:
        """Each clip's pixels (`video_pixels`); returns each video's tokens, its frames' interleaved
        with its own audio's (`audio_counts`, one per clip) when it is heard."""
        from omnistage.models.qwen_omni.video import frame_positions, video_pixels

        if self.image_processor is None:
            raise ValueError("this checkpoint has no image processor (preprocessor_config.json image fields)")
        rules = self.video_rules
        pixels, grids = zip(*(video_pixels(self.image_processor, clip.frames, rules) for clip in clips))
        prompt.video_grid = torch.tensor(grids, device=self.device)
        prompt.seconds_per_grid = torch.tensor([clip.seconds_per_grid for clip in clips])
        prompt.video_pixels = [torch.from_numpy(p).to(self.device, self.model.dtype) for p in pixels]
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

    def _encode_fed(self, prompt: MediaPrompt, start: int) -> tuple[dict[int, torch.Tensor], list[torch.Tensor] | None]:
        """Run the encoders on the items a prefill from position `start` feeds (any with a token at or
        after it: a prefix-cache hit skips the items wholly before it). Returns placeholder id ->
        [its tokens in those items, H], and per deepstack layer the features of their visual tokens
        (None without deepstack); `fed_rows` then takes the rows of the fed positions."""
        fed = [i for i, span in enumerate(prompt.spans) if span.end > start]
        if not fed:
            return {}, None
        embeds: dict[int, torch.Tensor] = {}
        deepstack: dict[int, list[torch.Tensor]] = {}
        heard = [j for j, item in enumerate(prompt.owners["audio"]) if item >= fed[0]]
        if heard:
            features, mask = prompt.audio_inputs
            embeds[self.audio_token_id] = self.model.get_audio_features(features[heard], mask[heard]).last_hidden_state
        for kind, token, grid, encode in (
                ("image", self.image_token_id, prompt.image_grid, self.model.get_image_features),
                ("video", self.video_token_id, prompt.video_grid, self.model.get_video_features)):
            chosen = [j for j, item in enumerate(prompt.owners[kind]) if item >= fed[0]]
            if chosen:
                pixels = (self._image_pixels(prompt, chosen) if kind == "image"
                          else torch.cat([prompt.video_pixels[j] for j in chosen]))
                out = encode(pixels, grid[chosen])
                embeds[token], layers = self._vision_features(out)
                if layers is not None:
                    deepstack[token] = layers
        tail = prompt.ids[prompt.spans[fed[0]].start:]
        return embeds, joint_deepstack(tail, deepstack, (self.image_token_id, self.video_token_id))

    def _vision_features(self, out: Any) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """A vision encoder output -> [its tokens, H] (and per deepstack layer, for a deepstack thinker)."""
        return torch.cat(out.pooler_output), None


def image_grid(processor: Any, image: Any) -> list[int]:
    """[1, grid_h, grid_w] of `image` (PIL, or a uint8 [H, W, 3] array) as the checkpoint's image
    processor resizes and patches it (its `smart_resize` of the image's size), without its pixels.
    Refuses any other array here, at admission: the processor only sees it at the first prefill."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    if isinstance(image, Image.Image):
        width, height = image.size
    else:
        array = np.asarray(image)
        if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3:
            raise ValueError(f"an image part must be a PIL image or a uint8 [H, W, 3] array, got {array.dtype} "
                             f"{list(array.shape)}")
        height, width = array.shape[:2]
    if processor.do_resize:
        height, width = smart_resize(height, width, factor=processor.patch_size * processor.merge_size,
                                     min_pixels=processor.size["shortest_edge"],
                                     max_pixels=processor.size["longest_edge"])
    return [1, height // processor.patch_size, width // processor.patch_size]


def image_processor(model_path: str, cls):
    """The checkpoint's image processor, or None when its preprocessor_config.json has no image fields."""
    import json
    from pathlib import Path

    from transformers.utils import cached_file

    path = cached_file(model_path, "preprocessor_config.json", _raise_exceptions_for_missing_entries=False)
    if path is None or "image_processor_type" not in json.loads(Path(path).read_text()):
        return None  # image input is refused at admission
    return cls.from_pretrained(model_path)
