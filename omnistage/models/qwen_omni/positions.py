"""M-RoPE positions of a Qwen omni thinker's batch, from any cached position (chunks, prefix-cache hits)."""

from __future__ import annotations

import torch

from omnistage.ar.model import ModelInput


def mrope_positions(batch: ModelInput) -> torch.Tensor:
    """[3, B, T] M-RoPE positions of an omni thinker's batch: the prompt's own in it, position +
    rope_delta after it (decode, or a prefill recomputing generated tokens after a preemption).
    A prefill row may start at any cached position (chunks, prefix-cache hits). Shared by the
    Qwen omni thinkers, whose `ThinkerState`s both carry `mrope_positions` and `rope_delta`."""
    states = [s.model_state for s in batch.seqs]
    if batch.is_prefill:
        pos = batch.positions.new_zeros(3, *batch.positions.shape)
        for i, st in enumerate(states):
            start, n, prompt_len = batch.context_lens[i], batch.query_lens[i], st.mrope_positions.shape[1]
            split = max(0, min(n, prompt_len - start))  # this row's positions inside the prompt
            pos[:, i, :split] = st.mrope_positions[:, start:start + split]
            pos[:, i, split:n] = batch.positions[i, split:n] + st.rope_delta
        return pos
    delta = torch.tensor([st.rope_delta for st in states], device=batch.positions.device)
    return (batch.positions + delta[:, None]).expand(3, -1, -1)


class RopeIndex:
    """A thinker's `get_rope_index` over a prompt, reusing the positions of a recent prompt that
    starts the same way (a video chat's query repeats its warm-up's system prompt and frames).

    NOTE on exactness: `get_rope_index` walks the prompt segment by segment (a text run, an image
    between its <|vision_bos|> and <|vision_eos|>, an audio clip), each starting one past the
    largest position before it. So a prompt's first `cut` positions are those of any prompt with
    the same first `cut` ids and media when no item (with its opening token) straddles `cut`, and
    the rest are the rest's own positions shifted past them. Prompts with videos (whose tokens
    interleave with their audio) are computed whole.
    """

    MAX_PROMPTS = 8
    """Recent prompts kept (their ids, media digests and positions: 24 bytes per token)."""

    def __init__(self, get_rope_index, device: torch.device) -> None:
        self.get_rope_index = get_rope_index
        self.device = device
        self.recent: list[tuple[torch.Tensor, tuple, torch.Tensor]] = []  # (ids, spans, positions [3, L])

    def __call__(self, prompt, with_audio: bool) -> tuple[torch.Tensor, int]:
        """([3, L] positions, rope_delta) of `prompt` (a `media.MediaPrompt`)."""
        ids = torch.tensor(prompt.ids, device=self.device)
        if prompt.video_grid is not None or with_audio:
            positions = self._compute(prompt, ids, 0, with_audio)
        else:
            cut, head = self._shared_start(prompt, ids)
            if cut == len(ids):  # all of it starts a recent prompt
                positions = head
            else:
                tail = self._compute(prompt, ids, cut, False)
                positions = tail if cut == 0 else torch.cat([head, tail + head.max() + 1], dim=1)
            self.recent.insert(0, (ids, prompt.spans, positions))
            del self.recent[self.MAX_PROMPTS:]
        return positions, int(positions.max()) + 1 - len(prompt.ids)

    def _shared_start(self, prompt, ids: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """(cut, positions [3, cut]) of the recent prompt sharing the longest start with `prompt`."""
        best, head = 0, None
        for i, (old_ids, old_spans, old_positions) in enumerate(self.recent):
            n = min(len(old_ids), len(ids))
            differ = torch.nonzero(old_ids[:n] != ids[:n])
            cut = int(differ[0]) if len(differ) else n
            cut = _before_items(prompt.spans, cut)
            if cut <= best:
                continue
            if [s for s in old_spans if s.end <= cut] != [s for s in prompt.spans if s.end <= cut]:
                continue  # another image or clip behind the same ids
            best, head = cut, old_positions[:, :cut]
        return best, head

    def _compute(self, prompt, ids: torch.Tensor, cut: int, with_audio: bool) -> torch.Tensor:
        """get_rope_index of ids[cut:] with the grids and lengths of the items in it -> [3, L - cut]."""
        def items(kind: str) -> list[int]:
            return [j for j, item in enumerate(prompt.owners.get(kind, [])) if prompt.spans[item].start >= cut]

        images, audios = items("image"), items("audio")
        image_grid = prompt.image_grid[images] if prompt.image_grid is not None and images else None
        audio_seqlens = prompt.audio_seqlens[audios] if prompt.audio_seqlens is not None and audios else None
        if cut == 0:
            image_grid, audio_seqlens = prompt.image_grid, prompt.audio_seqlens
        tail = ids[cut:][None]
        positions, _ = self.get_rope_index(tail, image_grid, prompt.video_grid, torch.ones_like(tail), with_audio,
                                           audio_seqlens, prompt.seconds_per_grid)
        return positions[:, 0]


def _before_items(spans, cut: int) -> int:
    """`cut` moved back to the opening token of any item it would split."""
    for span in reversed(spans):
        if span.start - 1 < cut < span.end:
            cut = span.start - 1
    return max(cut, 0)
