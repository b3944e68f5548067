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
def one_thread():
    """Tiny models are bound by per-op overhead: one intra-op thread is faster, and far faster on a
    shared machine where OpenMP threads spin against other work. Restored after each module."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
