"""The reference inputs of a Qwen omni `generate()`: what the family's processor would make.

`Qwen2_5OmniProcessor` and `Qwen3OmniMoeProcessor` cannot be built without torchvision (their
video processors import it), so this does their work with their own pieces: the tokenizer's
chat template, the Whisper feature extractor with the processor's audio kwargs, the PIL image
processor, and for a video the processor's own `replace_video_token` /
`replace_video_with_audio_token` (called on the attributes they read) for the placeholder
layout. Only the video pixels come from omnistage (`video_pixels`, `sample_frame_indices`): the
processors' own pixel path is torchvision's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch

from omnistage.models.qwen_omni.video import VideoRules, sample_frame_indices, video_pixels


@dataclass
class OmniReference:
    tokenizer: Any
    features: Any
    feature_kwargs: dict
    output_lengths: Callable  # the processor module's _get_feat_extract_output_lengths
    image_processor: Any
    processor_cls: type  # for its video placeholder methods
    tokens: dict  # "audio" / "image" / "video" / "audio_bos" / "audio_eos" -> token string
    rules: VideoRules

    def ids(self, name: str) -> int:
        return self.tokenizer.convert_tokens_to_ids(self.tokens[name])

    def inputs(self, messages: list, use_audio_in_video: bool = False) -> dict:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]
        parts = [p for m in messages if isinstance(m["content"], list) for p in m["content"]]
        heard = [p for p in parts if p["type"] == "audio" or (p["type"] == "video" and use_audio_in_video)]
        inputs, counts = {}, []
        if heard:  # 16 kHz clips, in prompt order (a heard video's audio at its place)
            clips = [p["audio"] if p["type"] == "audio" else p["audio_track"] for p in heard]
            feats = self.features(clips, sampling_rate=16000, return_attention_mask=True, return_tensors="pt",
                                  **self.feature_kwargs)
            inputs = {"input_features": feats["input_features"], "feature_attention_mask": feats["attention_mask"]}
            counts = self.output_lengths(feats["attention_mask"].sum(-1)).tolist()
        audio_counts = iter(c for c, p in zip(counts, heard) if p["type"] == "audio")
        video_audio = iter(c for c, p in zip(counts, heard) if p["type"] == "video")
        images = [p["image"] for p in parts if p["type"] == "image"]
        image_counts = iter([])
        if images:  # the processor's image path, PIL backend (its default backend needs torchvision)
            pixels = self.image_processor(images=images, return_tensors="pt")
            inputs.update(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
            image_counts = iter((pixels["image_grid_thw"].prod(-1) // self.image_processor.merge_size**2).tolist())
        videos = [p for p in parts if p["type"] == "video"]
        video_tokens = iter([])
        if videos:
            t = self.image_processor.temporal_patch_size
            pixels, grids = zip(*(video_pixels(self.image_processor, v["video"][sample_frame_indices(
                len(v["video"]), v["fps"], self.rules.fps, t, self.rules.min_frames, self.rules.max_frames)],
                self.rules) for v in videos))
            seconds = [t / self.rules.fps] * len(videos)
            inputs.update(pixel_values_videos=torch.from_numpy(np.concatenate(pixels)),
                          video_grid_thw=torch.tensor(grids), video_second_per_grid=torch.tensor(seconds))
            if use_audio_in_video:
                inputs["use_audio_in_video"] = True
            video_tokens = iter([self.video_tokens(grid, seconds[0], next(video_audio) if use_audio_in_video else None)
                                 for grid in grids])
        replace = {self.ids("audio"): lambda token: [token] * next(audio_counts),
                   self.ids("image"): lambda token: [token] * next(image_counts),
                   self.ids("video"): lambda token: next(video_tokens)}
        expanded = [t for token in ids for t in (replace[token](token) if token in replace else [token])]
        x = torch.tensor([expanded])
        return {"input_ids": x, "attention_mask": torch.ones_like(x), **inputs}

    def video_tokens(self, grid, seconds_per_grid: float, num_audio: int | None) -> list[int]:
        """A video's placeholder tokens as the processor lays them out (its own methods)."""
        P = self.processor_cls
        ns = SimpleNamespace(video_token=self.tokens["video"], audio_token=self.tokens["audio"],
                             audio_bos_token=self.tokens["audio_bos"], audio_eos_token=self.tokens["audio_eos"],
                             video_processor=SimpleNamespace(merge_size=self.image_processor.merge_size))
        ns.get_chunked_index = lambda indices, per_chunk: P.get_chunked_index(ns, indices, per_chunk)
        videos = {"video_grid_thw": [torch.tensor(grid)], "video_second_per_grid": [seconds_per_grid]}
        if num_audio is None:
            text = P.replace_video_token(ns, videos, 0, load_audio_from_video=False)
        else:
            text = P.replace_video_with_audio_token(ns, videos, 0, {"num_audio_tokens": [num_audio]}, 0,
                                                    position_id_per_seconds=self.rules.position_id_per_seconds,
                                                    seconds_per_chunk=self.rules.seconds_per_chunk)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def moving_frames(num: int, seed: int = 0, height: int = 56, width: int = 84) -> np.ndarray:
    rng = np.random.RandomState(seed)
    return (rng.rand(num, height, width, 3) * 255).astype(np.uint8)


def tone(seconds: float, hz: float = 220.0, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def check_rope_reuse(thinker, with_clip: bool = True) -> None:
    """A thinker's M-RoPE positions of prompts that grow as a video chat's do (frames, a clip, a
    question; then more frames) equal `get_rope_index` over each whole prompt, and all but the
    first are computed from where the previous prompt left off (`qwen_omni.positions.RopeIndex`).
    (`with_clip=False` leaves the clip out: Qwen2.5-Omni pads every clip to 30 s of features.)"""
    from omnistage.models.qwen_omni.positions import RopeIndex

    rng = np.random.RandomState(5)
    frames = [(rng.rand(112, 112, 3) * 255).astype(np.uint8) for _ in range(3)]
    clip = {"type": "audio", "audio": tone(0.5), "sample_rate": 16000}
    system = {"role": "system", "content": "You watch a video."}

    def messages(num_frames, question=""):
        parts = [{"type": "image", "image": f} for f in frames[:num_frames]] + ([clip] if with_clip else [])
        return [system, {"role": "user", "content": parts + ([{"type": "text", "text": question}] if question else [])}]

    fed = []  # tokens per get_rope_index call
    full = thinker.model.get_rope_index

    def counting(ids, *args):
        fed.append(ids.shape[1])
        return full(ids, *args)

    thinker.rope_index = RopeIndex(counting, thinker.device)
    for msgs in (messages(2), messages(2, "What is it?"), messages(3, "And now?"), messages(2)):
        prompt = thinker.build_prompt({"messages": msgs})
        ids = torch.tensor([prompt.token_ids])
        grid, seqlens = prompt.model_state.media.image_grid, prompt.model_state.media.audio_seqlens
        want, delta = full(ids, grid, None, torch.ones_like(ids), False, seqlens, None)
        torch.testing.assert_close(prompt.model_state.mrope_positions, want[:, 0], rtol=0, atol=0)
        assert prompt.model_state.rope_delta == int(delta)
        if fed and not isinstance(fed[-1], tuple):
            fed[-1] = (fed[-1], len(prompt.token_ids))
    # The last prompt starts the second one whole (no question): it calls get_rope_index not at all.
    assert fed[0][0] == fed[0][1] and all(n < total for n, total in fed[1:3]) and len(fed) == 3, fed
    thinker.rope_index = RopeIndex(full, thinker.device)
