"""The config files of a diffusers checkpoint, read without loading any weights.

Requests are validated once, in the engine process, against facts of the checkpoint
(VAE downsampling, patch sizes, the transformer's guidance embedding, the default image
size, Wan's expert boundary). Those facts live in the checkpoint's JSON files, so the
engine reads them here and a pipeline class derives its request rules from them in
`configure` (the same method its loaded instance runs): no weights, no round trip to the
workers, one source of truth.
"""

from __future__ import annotations

from typing import Any

from omnistage.config.model_files import ModelFiles

# A component's config file, by the kind of component (diffusers' and transformers' names).
_CONFIG_FILES = ("config.json", "scheduler_config.json", "tokenizer_config.json", "preprocessor_config.json",
                 "guider_config.json")


class ConfigView(dict):
    """A config dict whose keys also read as attributes (`vae.block_out_channels`), like
    diffusers' own `config` objects."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class CheckpointConfigs:
    """`pipeline` is model_index.json; `component(name)` each component's config ({} when absent)."""

    def __init__(self, pipeline: dict[str, Any], components: dict[str, dict[str, Any]]):
        self.pipeline = ConfigView(pipeline)
        self._components = {name: ConfigView(c) for name, c in components.items()}

    @classmethod
    def read(cls, model: str) -> "CheckpointConfigs":
        """A local folder's or a hub model's model_index.json and component configs."""
        files = ModelFiles(model)
        index = files.model_index
        if index is None:
            raise ValueError(f"{model}: no model_index.json (not a diffusers pipeline folder)")
        components = {}
        for name, entry in index.items():
            if name.startswith("_") or not isinstance(entry, list) or entry[0] is None:
                continue  # metadata, or a component the checkpoint leaves out
            components[name] = next((c for f in _CONFIG_FILES if (c := files.read_json(f"{name}/{f}")) is not None),
                                    {})
        return cls(index, components)

    @property
    def class_name(self) -> str:
        if "_class_name" not in self.pipeline:
            raise ValueError("model_index.json has no _class_name")
        return self.pipeline["_class_name"]

    def has(self, name: str) -> bool:
        return name in self._components

    def component(self, name: str) -> ConfigView:
        return self._components.get(name, ConfigView())

    def max_text_tokens(self, names: tuple[str, ...]) -> int | None:
        """The fewest tokens any of the components `names` takes: a tokenizer's
        `model_max_length` (transformers' "no limit" placeholder, 1e30, is none), a text
        encoder's `max_position_embeddings` / `n_positions` (its `text_config`'s for a
        multimodal encoder). None when none of them states a limit."""
        limits = []
        for name in names:
            config = self.component(name)
            for source in (config, config.get("text_config") or {}):
                for key in ("model_max_length", "max_position_embeddings", "n_positions"):
                    value = source.get(key)
                    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31:
                        limits.append(value)
        return min(limits) if limits else None

    def __getattr__(self, name: str) -> ConfigView:
        """`configs.vae`, `configs.transformer`, ...: a component's config."""
        if name.startswith("_"):
            raise AttributeError(name)
        return self.component(name)
