"""`vae_patch_parallel_size: N`: the tiles of a tiled VAE decode are decoded on N ranks and
gathered, so every rank ends with exactly the tiled decode of one rank.

Every rank holds the same final latents (CFG and sequence parallel keep the ranks' states
identical), so each decodes its share of the tiles: tile t on rank t % N. The VAE's own
`tiled_decode` runs twice around a `TileSharingDecoder` put in the place of `vae.decoder`:
first it decodes this rank's tiles for real and answers zeros of the right shape for the
others (that blended result is thrown away), then the ranks exchange their tiles, and the
second run replays every tile's decoded value, so diffusers' own blending makes the output
(exact, not an approximation of it). Turns `vae_use_tiling` on. A family takes it by declaring
`vae_patch_parallel` (declaration.py); the tile sharing is written for two kinds of VAE:
image VAEs (AutoencoderKL) and causal video VAEs (Wan's, Qwen-Image's), whose decoder runs per
latent frame inside a tile with a cache that `clear_cache` renews per tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.diffusion.accel.cfg_parallel import _exchange

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig


@dataclass(frozen=True)
class VaePatchParallelConfig:
    size: int


def from_deploy(deploy: StageDeployConfig) -> VaePatchParallelConfig | None:
    return VaePatchParallelConfig(deploy.vae_patch_parallel_size) if deploy.vae_patch_parallel_size > 1 else None


def apply(pipeline: Any, config: VaePatchParallelConfig) -> None:
    import torch.distributed as dist

    field = f"vae_patch_parallel_size={config.size}"
    vae = pipeline.components.get("vae")
    if not pipeline.supported_accelerations.vae_patch_parallel or vae is None:  # check_declared refuses it first
        raise ValueError(f"{field}: {pipeline.reference_class} does not declare vae_patch_parallel")
    if not dist.is_initialized() or dist.get_world_size() < config.size:
        raise ValueError(f"{field} needs executor 'mp' with num_devices >= {config.size}")
    # Collective: every rank makes the group; ranks past `size` decode alone (their output is
    # never returned: rank 0's is).
    group = dist.new_group(list(range(config.size)))
    vae.enable_tiling()
    if dist.get_rank() < config.size:
        vae.decoder = TileSharingDecoder(vae.decoder, _tile_shape(vae), group)
        pipeline.vae_decode = _sharing_decode(vae, vae.decoder)


class TileSharingDecoder(torch.nn.Module):
    """Stands in for a VAE's decoder: off, it is the decoder; while `recording`, it decodes this
    rank's tiles and answers zeros for the others; while `replaying`, it answers the gathered
    decoded value of every call in order."""

    def __init__(self, decoder: torch.nn.Module, tile_shape: Any, group: Any):
        super().__init__()
        self.decoder = decoder
        self.tile_shape = tile_shape
        self.group = group
        self.mode = "off"
        self.calls: list[tuple[int, bool]] = []  # per call: (tile index, whether this rank decoded it)
        self.mine: list[torch.Tensor] = []
        self.replay: list[torch.Tensor] = []
        self._cache: Any = None

    def forward(self, z: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.mode == "off":
            return self.decoder(z, *args, **kwargs)
        if self.mode == "replaying":
            return self.replay.pop(0)
        import torch.distributed as dist

        # A causal VAE renews its feature cache per tile; a plain one decodes a tile per call.
        cache = kwargs.get("feat_cache")
        new_tile = not self.calls or cache is None or cache is not self._cache
        self._cache = cache
        tile = self.calls[-1][0] + int(new_tile) if self.calls else 0
        ours = tile % dist.get_world_size(self.group) == dist.get_rank(self.group)
        self.calls.append((tile, ours))
        if not ours:
            return z.new_zeros(self.tile_shape(z, new_tile))
        out = self.decoder(z, *args, **kwargs)
        if tuple(out.shape) != tuple(self.tile_shape(z, new_tile)):
            raise RuntimeError(f"vae_patch_parallel_size: decoded tile {tuple(out.shape)} differs from the "
                               f"expected {tuple(self.tile_shape(z, new_tile))}")
        self.mine.append(out.clone())  # the VAE blends its tiles in place
        return out


def _sharing_decode(vae: Any, sharing: TileSharingDecoder) -> Any:
    def decode(latents: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        sharing.mode, sharing.calls, sharing.mine, sharing._cache = "recording", [], [], None
        try:
            vae.decode(latents, return_dict=False)
            per_rank = _exchange(sharing.mine, sharing.group, latents.device)
            world = dist.get_world_size(sharing.group)
            taken = [0] * world
            sharing.replay = []
            for tile, _ in sharing.calls:
                owner = tile % world
                sharing.replay.append(per_rank[owner][taken[owner]])
                taken[owner] += 1
            sharing.mode = "replaying"
            return vae.decode(latents, return_dict=False)[0]
        finally:
            sharing.mode, sharing.mine, sharing.replay, sharing._cache = "off", [], [], None
    return decode


def _tile_shape(vae: Any) -> Any:
    """(latent tile, starts a tile) -> the decoder's output shape for it."""
    channels = vae.decoder.conv_out.out_channels
    if not hasattr(vae.config, "temperal_downsample"):  # an image VAE
        up = 2 ** (len(vae.config.block_out_channels) - 1)
        return lambda z, first: (z.shape[0], channels, z.shape[2] * up, z.shape[3] * up)
    up = 2 ** len(vae.config.temperal_downsample)
    # A causal VAE's first latent frame decodes to one frame, each later one to 2^(temporal downsamples).
    frames = 2 ** sum(vae.config.temperal_downsample)
    return lambda z, first: (z.shape[0], channels, 1 if first else frames, z.shape[3] * up, z.shape[4] * up)
