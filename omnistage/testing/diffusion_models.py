"""Diffusion zoo builders (diffusers model_index.json folders)."""
