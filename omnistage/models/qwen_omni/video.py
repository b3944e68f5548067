"""Video input for the Qwen omni thinkers, without torchvision.

transformers 5's video processors (`Qwen2VLVideoProcessor`) import torchvision, which
omnistage does not use, so this module does their work on the PIL/numpy path:

- `sample_frame_indices`: which frames to keep, as `Qwen2VLVideoProcessor.sample_frames`
  chooses them for a target fps (a multiple of `temporal_patch_size`, within
  `[min_frames, max_frames]`);
- `video_pixels`: each kept frame resized, rescaled and normalised by the checkpoint's
  PIL image processor (so a video frame is prepared exactly as an image is), then
  `temporal_patch_size` consecutive frames stacked into one patch, the layout of the
  video processor's `patchify` (the last frame repeats to fill the last group).
  One difference remains: torchvision's bicubic resize of a uint8 tensor and PIL's
  bicubic resize round differently, so pixels differ from the torchvision path by
  about one grey level where a frame is resized;
- `interleave_in_chunks` / `interleave_by_time`: where a video's own audio tokens go
  between its frame tokens (`use_audio_in_video`), as Qwen2.5-Omni's processor (2-second
  chunks) and Qwen3-Omni's (by start time) lay them out.

A video part is `{"type": "video", "video": <encoded bytes> | uint8 [F, H, W, 3], "fps": float}`
(`fps` is needed for frame arrays) with, for arrays, an optional `"audio_track"` waveform (not `"audio"`: chat templates
render any part with an "audio" key as an audio part) and
`"sample_rate"`; encoded videos bring their own audio track.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class VideoRules:
    """A family's video defaults: those of its transformers processor (not in the checkpoint)."""

    fps: float
    """Frames sampled per second (the processor's fallback when the call names none)."""
    min_pixels: int
    max_pixels: int
    """Per-frame pixel bounds of the resize (the processor's `videos_kwargs["size"]`)."""
    position_id_per_seconds: float
    seconds_per_chunk: float
    min_frames: int = 4
    max_frames: int = 768


@dataclass
class VideoClip:
    """One video part, sampled: its frames, the seconds one temporal patch spans, its audio."""

    frames: np.ndarray  # uint8 [F, H, W, 3]
    seconds_per_grid: float
    audio: tuple[np.ndarray, int] | None = None  # (float32 mono, sample rate)


def sample_frame_indices(total: int, source_fps: float, fps: float, temporal_patch_size: int,
                         min_frames: int, max_frames: int) -> list[int]:
    """`Qwen2VLVideoProcessor.sample_frames` with `fps`: evenly spaced frame indices."""
    if total < temporal_patch_size or source_fps <= 0:
        raise ValueError(f"a video part needs at least {temporal_patch_size} frames and a known fps, "
                         f"got {total} frames at {source_fps} fps")
    most = math.floor(min(max_frames, total) / temporal_patch_size) * temporal_patch_size
    count = min(max(total / source_fps * fps, min_frames), most, total)
    count = math.floor(count / temporal_patch_size) * temporal_patch_size
    return np.arange(0, total, total / count).astype(np.int32).tolist()


def read_clip(part: dict, rules: VideoRules, temporal_patch_size: int, with_audio: bool) -> VideoClip:
    """A chat video part -> its sampled frames (and its audio when `with_audio`)."""
    from omnistage.media.video import decode_video_audio, decode_video_frames, probe_video

    video = part.get("video")
    if isinstance(video, (bytes, bytearray)):
        info = probe_video(bytes(video))
        indices = sample_frame_indices(info.num_frames, info.fps, rules.fps, temporal_patch_size,
                                       rules.min_frames, rules.max_frames)
        frames = decode_video_frames(bytes(video), indices)
        audio = decode_video_audio(bytes(video)) if with_audio else None
    elif video is not None:
        frames = np.asarray(video)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(f"a video part's frames must be uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
        if "fps" not in part:
            raise ValueError("a video part given as frames needs its 'fps'")
        indices = sample_frame_indices(len(frames), float(part["fps"]), rules.fps, temporal_patch_size,
                                       rules.min_frames, rules.max_frames)
        frames = frames[indices]
        audio = (part["audio_track"], int(part["sample_rate"])) if with_audio and part.get("audio_track") is not None else None
    else:
        raise ValueError("a video part needs 'video' (encoded bytes, or uint8 [F, H, W, 3] frames with 'fps')")
    if with_audio and audio is None:
        raise ValueError("use_audio_in_video is set but the video part has no audio")
    return VideoClip(frames, temporal_patch_size / rules.fps, audio)


def video_pixels(image_processor: Any, frames: np.ndarray, rules: VideoRules) -> tuple[np.ndarray, list[int]]:
    """(pixel_values_videos [grid_t * grid_h * grid_w, C * T * P * P], grid_thw [3]) of one clip."""
    size = {"shortest_edge": rules.min_pixels, "longest_edge": rules.max_pixels}
    out = image_processor(images=list(frames), size=size, return_tensors="np")
    _, grid_h, grid_w = (int(v) for v in out["image_grid_thw"][0])
    t, p = image_processor.temporal_patch_size, image_processor.patch_size
    # The image processor repeats each frame over the temporal axis: keep one copy per frame.
    per_frame = out["pixel_values"].reshape(len(frames), grid_h * grid_w, -1, t, p * p)[:, :, :, 0]
    if pad := -len(frames) % t:
        per_frame = np.concatenate([per_frame, np.repeat(per_frame[-1:], pad, axis=0)])
    grid_t = len(per_frame) // t
    grouped = per_frame.reshape(grid_t, t, grid_h * grid_w, -1, p * p).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(grouped.reshape(grid_t * grid_h * grid_w, -1)), [grid_t, grid_h, grid_w]


def frame_positions(grid_thw: list[int], merge_size: int, seconds_per_grid: float,
                    position_id_per_seconds: float) -> np.ndarray:
    """Each video token's temporal position id (one per merged patch, frame group by frame group)."""
    grid_t, grid_h, grid_w = grid_thw
    per_group = (grid_h // merge_size) * (grid_w // merge_size)
    return np.repeat(np.arange(grid_t), per_group) * seconds_per_grid * position_id_per_seconds


def interleave_in_chunks(video_times: np.ndarray, num_audio: int, rules: VideoRules) -> list[str]:
    """Qwen2.5-Omni: per `seconds_per_chunk` of time, that chunk's video tokens then its audio tokens
    (a list of "video" / "audio", one per token)."""
    per_chunk = int(rules.position_id_per_seconds * rules.seconds_per_chunk)
    video = _chunk_lengths(video_times, per_chunk)
    audio = _chunk_lengths(np.arange(num_audio), per_chunk)
    order: list[str] = []
    for j in range(max(len(video), len(audio))):
        order += ["video"] * (video[j] if j < len(video) else 0)
        order += ["audio"] * (audio[j] if j < len(audio) else 0)
    return order


def interleave_by_time(video_times: np.ndarray, num_audio: int) -> list[str]:
    """Qwen3-Omni: tokens merged by start time (one position id per audio token); a frame
    group goes before audio that starts at the same time."""
    order, v, a = [], 0, 0
    while v < len(video_times) and a < num_audio:
        if video_times[v] <= a:
            order.append("video")
            v += 1
        else:
            order.append("audio")
            a += 1
    return order + ["video"] * (len(video_times) - v) + ["audio"] * (num_audio - a)


def _chunk_lengths(times: np.ndarray, per_chunk: int) -> list[int]:
    """Token counts of consecutive chunks: chunk k holds the times in [k, k + 1) * per_chunk
    (an empty chunk closes before a time that skips ahead, as the processor's index split does)."""
    lengths, start, chunk = [], 0, 1
    for i, value in enumerate(times):
        if value >= chunk * per_chunk:
            lengths.append(i - start)
            start, chunk = i, chunk + 1
    lengths.append(len(times) - start)
    return lengths
