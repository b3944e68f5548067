"""The tiny model zoo and test helpers (see zoo.py)."""

from omnistage.testing.zoo import SIZES, ZooModel, build, call_kwargs, default_cache_dir, ensure, get_model, list_models

__all__ = ["SIZES", "ZooModel", "build", "call_kwargs", "default_cache_dir", "ensure", "get_model", "list_models"]
