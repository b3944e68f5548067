"""The checkpoint files pipeline detection reads: `config.json` and `model_index.json`.

A model is a local folder or a Hugging Face hub id. For a hub id the files come from the
hub cache first (no network when the model was downloaded before), then from the hub.
A file that cannot be found is None: detection then tries its next rule.
"""

from __future__ import annotations

import json
import logging
from functools import cached_property
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ModelFiles:
    """Lazily read JSON files of one model; what a pipeline resolver gets to inspect."""

    def __init__(self, model: str) -> None:
        self.model = str(model)
        """The path or hub id as the user gave it."""
        self._hub_unreachable = False

    @property
    def is_local(self) -> bool:
        return Path(self.model).expanduser().is_dir()

    @cached_property
    def config(self) -> dict[str, Any] | None:
        """transformers' `config.json` (model_type, architectures, ...), or None."""
        return self.read_json("config.json")

    @cached_property
    def model_index(self) -> dict[str, Any] | None:
        """diffusers' `model_index.json` (_class_name and components), or None."""
        return self.read_json("model_index.json")

    def read_json(self, filename: str) -> dict[str, Any] | None:
        """A JSON file of the model as a dict, or None when the model has no such file."""
        path = self._local_file(filename) if self.is_local else self._hub_file(filename)
        if path is None:
            return None
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"model {self.model!r}: cannot read {filename}: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"model {self.model!r}: {filename} is not a JSON object")
        return data

    def _local_file(self, filename: str) -> Path | None:
        path = Path(self.model).expanduser() / filename
        return path if path.is_file() else None

    def _hub_file(self, filename: str) -> str | None:
        try:
            from huggingface_hub import hf_hub_download, try_to_load_from_cache
            from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
        except ImportError:
            return None
        try:
            cached = try_to_load_from_cache(self.model, filename)
        except ValueError:  # HFValidationError: not a repo id (e.g. a local path that does not exist)
            return None
        if isinstance(cached, str):
            return cached
        if cached is not None or self._hub_unreachable:
            return None  # the cache remembers the file is absent, or the hub already failed us
        try:
            return hf_hub_download(self.model, filename)
        except LocalEntryNotFoundError as e:
            # The hub could not be asked (offline mode, no network, hub down) and the cache
            # has nothing: do not wait through the client's retries again for the next file.
            logger.info("Hugging Face hub unreachable for %s: %s", self.model, e)
            self._hub_unreachable = True
        except (EntryNotFoundError, OSError, ValueError) as e:
            # Missing file, unknown or gated repo: all mean "try the next rule".
            logger.debug("no %s for %s on the hub: %s", filename, self.model, e)
        return None
