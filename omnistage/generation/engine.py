"""`GenerationEngine`: batched, chunk-streaming single-pass decoders (vocoders, codec decoders).

    step():  pick up to max_num_seqs streams with pending frames, nearest an underrun first
             take the next chunk of each (at most `chunk_frames` frames, one request's)
             Decoder.decode(chunks, stream states)     one batched pass
             -> AudioPayload(is_chunk=True) pieces, then one final AudioPayload per request

Requests (`StageRequest.inputs`), three ways:

1. Whole: codes (tensor, array or nested list, frames first) or `{"codes": codes}`. The
   request is decoded in chunks of `chunk_frames`, streaming out `is_chunk=True` pieces;
   its last output is `finished=True` with the whole waveform (`is_chunk=False`).
2. Streamed into one request: `{"codes": first_frames, "is_last": False}`, then
   `add_chunk(request_id, codes, is_last)` as more frames arrive. Output as in 1.
3. Parts of a stream (the orchestrator's streamed edges send one engine request per
   upstream chunk): `{"codes": frames, "stream_id": sid, "is_last": bool}`. Each part
   finishes with its own audio; the decoder state (e.g. Mimi's KV cache and convolution
   context) carries from part to part of `sid` until the part with `is_last=True`.
   Parts of one stream must be added in order.

Any of these may also carry `"options"`: decoder-specific settings of the stream (e.g. a
voice), taken from its first request and handed to `Decoder.open_stream(options)`. When a
stream's last request finishes, `Decoder.flush` gives the audio a decoder held back (a
non-causal codec's lookahead), which ends that request's audio.

`params` is unused (None). Abort drops the request (and its stream) without an output;
aborting a stream id drops the stream (the orchestrator does, for a request aborted while
none of its stream's parts is in flight).
Scheduling: up to `OPEN_STREAMS_PER_SEAT` x max_num_seqs streams may be open (their decoder
state is small); each pass decodes the max_num_seqs whose listener would run out of audio
first (earliest deadline, from a real-time player of the audio each stream got so far; a
stream with none yet is due at its arrival; `Playback.deadline`, which also bounds how long
late streams delay a newcomer's first chunk). When all ready streams fit, the order changes
nothing.

The engine is driven by one caller; calls are not meant to be concurrent.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.core.cpu_linear import prepack_linears
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.config.spec import StageSpec
from omnistage.core.device import device_scope, resolve_device, resolve_dtype
from omnistage.core.parking import Parked, return_freed_memory, check_can_sleep, check_can_update
from omnistage.core.playback import Playback
from omnistage.core.types import AudioPayload, StageOutput, StageRequest
from omnistage.core.weights import NO_FOLDER, Dropped, load_weights, weights_folder
from omnistage.generation.decoder import get_decoder_class

logger = logging.getLogger(__name__)

OPEN_STREAMS_PER_SEAT = 4
"""Open streams per batch seat: more streams than a pass decodes stay open, taking turns by deadline."""


@dataclass
class _Request:
    request_id: str
    stream: Any  # _Stream
    arrival_time: float
    ends_stream: bool  # the stream closes when this request finishes (always, except for non-last parts)
    complete: bool = False  # all of this request's frames have arrived
    pending: list[torch.Tensor] = field(default_factory=list)  # frames not decoded yet, in order
    pieces: list[np.ndarray] = field(default_factory=list)
    num_frames: int = 0
    first_audio_time: float | None = None

    @property
    def num_pending(self) -> int:
        return sum(p.shape[0] for p in self.pending)


@dataclass
class _Stream:
    stream_id: str
    arrival_time: float  # its first request's: the deadline of its first chunk
    requests: deque[_Request] = field(default_factory=deque)  # in order; the head is decoded first
    state: Any = None  # the decoder's, while open
    options: Any = None  # inputs["options"] of its first request, for open_stream
    is_open: bool = False
    num_frames: int = 0
    playback: Playback = field(default_factory=Playback)  # a real-time player of the audio decoded so far

    def ready(self) -> bool:
        """Its head request has frames to decode, or has all its frames and only needs finishing."""
        head = self.requests[0] if self.requests else None
        return head is not None and (head.num_pending > 0 or head.complete)


class GenerationEngine:
    def __init__(self, model_path: str, stage: StageSpec | None = None,
                 config: StageDeployConfig = StageDeployConfig(), *, chunk_frames: int | None = None) -> None:
        self.device = device = resolve_device(config.devices)
        self._stage, self._dtype = stage, resolve_dtype(config.dtype, device)
        with device_scope(device):
            self.decoder = get_decoder_class(stage.model if stage else None).load(
                model_path, stage, device, self._dtype, OPEN_STREAMS_PER_SEAT * config.max_num_seqs)
        self._weights_path = weights_folder(model_path)  # what sleep level 2 reads back
        self._dropped: Dropped | None = None
        if device.type == "cpu" and config.prepack_linears is not False and self.decoder.supports_prepacked_linears:
            prepack_linears(self.decoder.model)  # a decode feeds many frames: packed for the batched case
        self.max_num_seqs = config.max_num_seqs
        self.max_open_streams = OPEN_STREAMS_PER_SEAT * config.max_num_seqs
        self.chunk_frames = chunk_frames or self.decoder.chunk_frames
        self._streams: dict[str, _Stream] = {}  # by stream id, in arrival order
        self._requests: dict[str, _Request] = {}
        self._closed = False
        self._parked: Parked | None = None  # the decoder's weights, while asleep

    # --- requests in ---------------------------------------------------------------------------

    def add_request(self, request: StageRequest) -> None:
        rid = request.request_id
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already running")
        inputs = request.inputs if isinstance(request.inputs, dict) else {"codes": request.inputs}
        unknown = sorted(set(inputs) - {"codes", "is_last", "stream_id", "options"})
        if unknown:
            raise ValueError(f"unknown generation input key(s) {unknown}; expected codes, is_last, stream_id, options")
        if "codes" not in inputs:
            raise ValueError("generation inputs need 'codes'")
        codes = self.decoder.parse(inputs["codes"])
        sid = inputs.get("stream_id")
        is_last = bool(inputs.get("is_last", True))
        if sid is None:  # ways 1 and 2: the request is its own stream
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already a stream id")
            stream = _Stream(rid, request.arrival_time)
            req = _Request(rid, None, request.arrival_time, ends_stream=True)
        else:  # way 3: one part of stream `sid`, whole on arrival
            stream = self._streams.get(sid) or _Stream(sid, request.arrival_time)
            req = _Request(rid, None, request.arrival_time, ends_stream=is_last)
            is_last = True
        self._check_length(stream, codes.shape[0])
        req.stream = stream
        if stream.options is None:
            stream.options = inputs.get("options")
        self._streams.setdefault(stream.stream_id, stream)
        stream.requests.append(req)
        self._requests[rid] = req
        self._append(req, codes, complete=is_last)

    def add_chunk(self, request_id: str, codes: Any, is_last: bool = False) -> None:
        """More frames for a request opened with `is_last=False` (way 2 in the module docstring)."""
        req = self._requests.get(request_id)
        if req is None:
            raise ValueError(f"unknown request {request_id!r}")
        if req.complete:
            raise ValueError(f"request {request_id!r} already received its last chunk")
        codes = self.decoder.parse(codes)
        self._check_length(req.stream, codes.shape[0])
        self._append(req, codes, complete=is_last)

    def _append(self, req: _Request, codes: torch.Tensor, complete: bool) -> None:
        if codes.shape[0]:
            req.pending.append(codes)
        req.num_frames += codes.shape[0]
        req.stream.num_frames += codes.shape[0]
        req.complete = complete

    def _check_length(self, stream: _Stream, num_new: int) -> None:
        limit = self.decoder.max_frames
        if limit is not None and stream.num_frames + num_new > limit:
            raise ValueError(f"stream {stream.stream_id!r} would hold {stream.num_frames + num_new} frames, "
                             f"more than the decoder's max_frames={limit}")

    def abort_request(self, request_id: str) -> None:
        """Drop a request and its stream; or, given a stream id, the stream (and its state)."""
        req = self._requests.pop(request_id, None)
        stream = req.stream if req is not None else self._streams.get(request_id)
        if stream is not None:
            self._end_stream(stream)

    # --- the step --------------------------------------------------------------------------------

    def step(self) -> list[StageOutput]:
        with device_scope(self.device):  # streams open and decode on this stage's GPU
            return self._step()

    def _step(self) -> list[StageOutput]:
        outputs: list[StageOutput] = []
        batch = self._schedule(outputs)
        if not batch:
            return outputs
        chunks = [self._take(req) for req in batch]
        try:
            audio = self.decoder.decode(chunks, [req.stream.state for req in batch])
        except Exception as exc:  # a failed pass ends its requests, not the engine
            logger.exception("decoder pass failed for %d request(s)", len(batch))
            for req in batch:
                self._requests.pop(req.request_id, None)
                self._end_stream(req.stream)
                outputs.append(StageOutput(req.request_id, None, finished=True, error=f"{type(exc).__name__}: {exc}"))
            return outputs
        now = time.monotonic()
        for req, piece in zip(batch, audio):
            req.stream.playback.receive(len(piece) / self.decoder.sample_rate, now)
            req.pieces.append(piece)
            req.first_audio_time = req.first_audio_time or now
            outputs.append(self._output(req, piece))
        return outputs

    def _schedule(self, outputs: list[StageOutput]) -> list[_Request]:
        """Head requests of up to max_num_seqs ready streams, earliest deadline first (see the
        module docstring). Requests with nothing left to decode (an empty last chunk) finish
        here, without a pass."""
        ready = []
        for stream in list(self._streams.values()):
            while stream.ready() and stream.requests[0].num_pending == 0:  # complete, nothing left to decode
                outputs.append(self._output(stream.requests[0], np.zeros(0, dtype=np.float32)))
            if stream.ready():
                ready.append(stream)
        ready.sort(key=lambda s: s.playback.deadline(s.arrival_time))
        batch = []
        for stream in ready:
            if len(batch) >= self.max_num_seqs:
                break
            if not stream.is_open:
                if sum(s.is_open for s in self._streams.values()) >= self.max_open_streams:
                    continue
                options = () if stream.options is None else (stream.options,)
                try:
                    stream.state, stream.is_open = self.decoder.open_stream(*options), True
                except Exception as exc:  # e.g. options this decoder rejects: fail the stream, not the step
                    error = f"{type(exc).__name__}: {exc}"
                    outputs += [StageOutput(r.request_id, None, finished=True, error=error) for r in stream.requests]
                    self._end_stream(stream)
                    continue
            batch.append(stream.requests[0])
        return batch

    def _take(self, req: _Request) -> torch.Tensor:
        """The next chunk of `req`'s pending frames (at most chunk_frames)."""
        frames = torch.cat(req.pending) if len(req.pending) > 1 else req.pending[0]
        n = frames.shape[0] if self.chunk_frames is None else min(self.chunk_frames, frames.shape[0])
        req.pending = [frames[n:]] if n < frames.shape[0] else []
        return frames[:n]

    def _output(self, req: _Request, piece: np.ndarray) -> StageOutput:
        rate = self.decoder.sample_rate
        if not (req.complete and req.num_pending == 0):
            return StageOutput(req.request_id, AudioPayload(piece, rate, is_chunk=True), finished=False)
        # the request is done: the whole waveform; its stream moves on to the next part, or ends
        if req.ends_stream and req.stream.is_open:
            tail = self.decoder.flush(req.stream.state)
            if tail.size:
                req.pieces.append(tail)
                req.first_audio_time = req.first_audio_time or time.monotonic()
        whole = np.concatenate(req.pieces) if req.pieces else np.zeros(0, dtype=np.float32)
        req.stream.requests.popleft()
        self._requests.pop(req.request_id, None)
        if req.ends_stream:
            self._end_stream(req.stream)
        metrics = {"num_frames": req.num_frames, "audio_seconds": len(whole) / rate}
        if req.first_audio_time is not None:
            metrics["time_to_first_audio"] = req.first_audio_time - req.arrival_time
        return StageOutput(req.request_id, AudioPayload(whole, rate, is_chunk=False), finished=True, metrics=metrics)

    def _end_stream(self, stream: _Stream) -> None:
        for req in stream.requests:
            self._requests.pop(req.request_id, None)
        stream.requests.clear()
        if stream.is_open:
            self.decoder.close_stream(stream.state)
            stream.is_open, stream.state = False, None
        self._streams.pop(stream.stream_id, None)

    # --- Engine protocol ---------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def sleep(self, level: int) -> int:
        """When idle: the decoder's weights off the accelerator (level 1), or freed (level 2; wake_up
        reads them back from the checkpoint folder). Returns the bytes moved or freed."""
        check_can_sleep(level, len(self._requests))
        freed = 0
        if level == 2 and self._dropped is None:
            if self._weights_path is None:
                raise RuntimeError(NO_FOLDER)
            self._dropped = Dropped(self.decoder.model, self.decoder.model.state_dict().keys())
            freed = self._dropped.num_bytes
        if self._parked is None:
            self._parked = Parked([self.decoder.model])
        return_freed_memory()
        return freed + self._parked.num_bytes

    def wake_up(self) -> None:
        if self._parked is not None:
            self._parked.restore()
            self._parked = None
        if self._dropped is not None:
            with device_scope(self.device):
                self._dropped.restore(self.decoder.model, self._read_weights(self._weights_path))
            self._dropped = None

    def update_weights(self, path: str | None = None, tensors: dict[str, Any] | None = None) -> int:
        """New weights in place, when idle (the caller holds new requests back, so no stream hears a
        mix): the decoder of checkpoint folder `path`, or `tensors` by the decoder model's state-dict
        names. Returns how many tensors were replaced."""
        check_can_update(len(self._requests), self._dropped is not None)
        new = self._read_weights(path) if path is not None else tensors
        with device_scope(self.device):
            num = load_weights(self.decoder.model, new)
        self._weights_path = weights_folder(path) if path is not None else None
        return num

    def _read_weights(self, path: str) -> dict[str, torch.Tensor]:
        """The decoder model's tensors as checkpoint folder `path` holds them: each family keeps its
        decoder in files of its own, so the family's loader reads them (into a CPU copy, dropped after)."""
        fresh = type(self.decoder).load(path, self._stage, torch.device("cpu"), self._dtype, 1)
        try:
            return dict(fresh.model.state_dict())
        finally:
            fresh.close()

    def is_healthy(self) -> bool:
        return not self._closed

    def close(self) -> None:
        self._closed = True
        for stream in list(self._streams.values()):
            self._end_stream(stream)
        self.decoder.close()
