"""Fixtures for the AR engine tests: the zoo's tiny qwen2-llm and its transformers reference."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def llm_path(zoo) -> str:
    return str(zoo("qwen2-llm", size="tiny"))


@pytest.fixture(scope="session")
def tokenizer(llm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llm_path)


@pytest.fixture(scope="session")
def hf_model(llm_path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llm_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every module here runs its tiny models on one intra-op thread (tests/conftest.py)."""
