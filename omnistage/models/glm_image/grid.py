"""The geometry both GLM-Image stages agree on: which tokens the AR prior writes for a size.

For a target of H x W pixels the prior writes, after its prompt, a 16x16-ish preview grid
and then the target grid of one token per 32x32 pixels (`GlmImageProcessor._get_target_shape`),
then an end token: `num_new_tokens` in all. The DiT reads the target grid upsampled 2x
(nearest), one token per 16x16-pixel patch (`GlmImagePipeline._upsample_token_ids`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PIXELS_PER_TOKEN = 32
"""The processor's factor: one prior token per 32x32 pixels."""
DEFAULT_SIZE = 1024
"""Our default image side when a request gives none (diffusers' pipeline has no default)."""


@dataclass(frozen=True)
class PriorGrid:
    token_h: int
    token_w: int
    preview_h: int
    preview_w: int

    @property
    def num_target_tokens(self) -> int:
        return self.token_h * self.token_w

    @property
    def num_preview_tokens(self) -> int:
        return self.preview_h * self.preview_w

    @property
    def num_new_tokens(self) -> int:
        """Tokens the prior generates: the preview, the target grid, the end token."""
        return self.num_preview_tokens + self.num_target_tokens + 1

    @property
    def num_dit_tokens(self) -> int:
        return 4 * self.num_target_tokens

    def dit_prior_tokens(self, generated: list[int]) -> list[int]:
        """The generated tokens' target grid, upsampled 2x: the DiT's `prior_token_ids`."""
        start = self.num_preview_tokens
        grid = generated[start:start + self.num_target_tokens]
        if len(grid) != self.num_target_tokens:
            raise ValueError(f"the prior wrote {len(generated)} tokens; a {self.token_h}x{self.token_w} grid after a "
                             f"{self.preview_h}x{self.preview_w} preview needs {start + self.num_target_tokens}")
        w = self.token_w
        return [grid[(r // 2) * w + c // 2] for r in range(2 * self.token_h) for c in range(2 * w)]


def prior_grid(height: int, width: int) -> PriorGrid:
    """GlmImageProcessor._get_target_shape: the target grid and the preview grid for H x W."""
    token_h, token_w = height // PIXELS_PER_TOKEN, width // PIXELS_PER_TOKEN
    ratio = token_h / token_w
    half = PIXELS_PER_TOKEN // 2
    return PriorGrid(token_h, token_w, int(math.sqrt(ratio) * half), int(math.sqrt(1 / ratio) * half))
