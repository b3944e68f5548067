"""`vae_patch_parallel_size: N`: the tiles of a tiled VAE decode, and of the tiled encode of
an input image (edit and image-to-video families), are run on N ranks and gathered, so every
rank ends with exactly the tiled decode (encode) of one rank.

Every rank holds the same final latents (CFG and sequence parallel keep the ranks' states
identical) and the same input image, so each runs its share of the tiles: tile t on rank
t % N. The VAE's own `tiled_decode` (`tiled_encode`) runs twice around a `TileSharing` put in
the place of `vae.decoder` (`vae.encoder`): first it runs this rank's tiles for real and
answers zeros of the right shape for the others (that blended result is thrown away), then the
ranks exchange their tiles, and the second run replays every tile's value, so diffusers' own
blending makes the output (exact, not an approximation of it). Turns `vae_use_tiling` on. A
family takes it by declaring `vae_patch_parallel` (declaration.py) and encodes through the
pipeline's `vae_encode`; the tile sharing is written for two kinds of VAE: image VAEs
(AutoencoderKL) and causal video VAEs (Wan's, Qwen-Image's), whose decoder (encoder) runs per
latent frame (chunk of frames) inside a tile with a cache that `clear_cache` renews per tile.
"""

from __future__ import annotations

from collections.abc import Callable
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
        vae.decoder = TileSharing(vae.decoder, _decoded_tile_shape(vae), group)
        pipeline.vae_decode = _sharing(lambda z: vae.decode(z, return_dict=False)[0], vae.decoder)
        if getattr(vae, "encoder", None) is not None:
            vae.encoder = TileSharing(vae.encoder, _encoded_tile_shape(vae), group)
            pipeline.vae_encode = _sharing(vae.encode, vae.encoder)


class TileSharing(torch.nn.Module):
    """Stands in for a VAE's decoder (or encoder): off, it is that module; while `recording`, it
    runs this rank's tiles and answers zeros for the others; while `replaying`, it answers the
    gathered value of every call in order."""

    def __init__(self, module: torch.nn.Module, tile_shape: Any, group: Any):
        super().__init__()
        self.module = module
        self.tile_shape = tile_shape
        self.group = group
        self.mode = "off"
        self.calls: list[tuple[int, bool]] = []  # per call: (tile index, whether this rank decoded it)
        self.mine: list[torch.Tensor] = []
        self.replay: list[torch.Tensor] = []
        self._cache: Any = None

    def forward(self, z: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.mode == "off":
            return self.module(z, *args, **kwargs)
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
        out = self.module(z, *args, **kwargs)
        if tuple(out.shape) != tuple(self.tile_shape(z, new_tile)):
            raise RuntimeError(f"vae_patch_parallel_size: a tile out of the VAE's {type(self.module).__name__} "
                               f"is {tuple(out.shape)}, not the expected {tuple(self.tile_shape(z, new_tile))}")
        self.mine.append(out.clone())  # the VAE blends its tiles in place
        return out


def _sharing(run_vae: Callable[[torch.Tensor], Any], sharing: TileSharing) -> Callable[[torch.Tensor], Any]:
    """`run_vae` (a decode or an encode through `sharing`) with its tiles shared over the ranks."""
    def shared(x: torch.Tensor) -> Any:
        import torch.distributed as dist

        sharing.mode, sharing.calls, sharing.mine, sharing._cache = "recording", [], [], None
        try:
            run_vae(x)
            per_rank = _exchange(sharing.mine, sharing.group, x.device)
            world = dist.get_world_size(sharing.group)
            taken = [0] * world
            sharing.replay = []
            for tile, _ in sharing.calls:
                owner = tile % world
                sharing.replay.append(per_rank[owner][taken[owner]])
                taken[owner] += 1
            sharing.mode = "replaying"
            return run_vae(x)
        finally:
            sharing.mode, sharing.mine, sharing.replay, sharing._cache = "off", [], [], None
    return shared


def _decoded_tile_shape(vae: Any) -> Any:
    """(latent tile, starts a tile) -> the decoder's output shape for it."""
    channels = vae.decoder.conv_out.out_channels
    if not hasattr(vae.config, "temperal_downsample"):  # an image VAE
        up = 2 ** (len(vae.config.block_out_channels) - 1)
        return lambda z, first: (z.shape[0], channels, z.shape[2] * up, z.shape[3] * up)
    up = 2 ** len(vae.config.temperal_downsample)
    # A causal VAE's first latent frame decodes to one frame, each later one to 2^(temporal downsamples).
    frames = 2 ** sum(vae.config.temperal_downsample)
    return lambda z, first: (z.shape[0], channels, 1 if first else frames, z.shape[3] * up, z.shape[4] * up)


def _encoded_tile_shape(vae: Any) -> Any:
    """(pixel tile, starts a tile) -> the encoder's output shape for it (the latent distribution's
    parameters: mean and log-variance channels)."""
    channels = vae.encoder.conv_out.out_channels
    if not hasattr(vae.config, "temperal_downsample"):  # an image VAE
        down = 2 ** (len(vae.config.block_out_channels) - 1)
        return lambda x, first: (x.shape[0], channels, x.shape[2] // down, x.shape[3] // down)
    down = 2 ** len(vae.config.temperal_downsample)
    # A causal VAE encodes the first frame alone, then 2^(temporal downsamples) frames per call.
    frames = 2 ** sum(vae.config.temperal_downsample)
    return lambda x, first: (x.shape[0], channels, 1 if first else x.shape[2] // frames, x.shape[3] // down,
                             x.shape[4] // down)
