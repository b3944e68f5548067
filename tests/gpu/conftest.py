"""GPU tests: every test here needs CUDA and is skipped cleanly on a CPU machine.

They check what the CPU suite cannot: device placement and dtype resolution (`dtype: auto`
is bf16 on CUDA), the nccl path of the mp executor, and that parity with diffusers /
transformers still holds when both run on CUDA. Run them with `pytest -m gpu tests/gpu`
(scripts/device_check.sh does, on a lent GPU machine).

Set OMNISTAGE_GPU_REPORT=path to append one JSON line per measured number (PSNR, max abs
diff) to that file; the device script collects it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent.parent
# The parity helpers live beside their own tests (tests/diffusion/parity.py, tests/ar/ar_helpers.py).
for helper_dir in (TESTS / "diffusion", TESTS / "ar"):
    if str(helper_dir) not in sys.path:
        sys.path.insert(0, str(helper_dir))

NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False)"


def pytest_collection_modifyitems(config, items):
    """Mark every test in this folder `gpu`, and skip them all when there is no CUDA device."""
    here = Path(__file__).resolve().parent
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if skip is not None:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 parity needs real fp32 matmuls and convolutions. On Ampere and newer, cuDNN runs
    convolutions in TF32 by default (torch.backends.cudnn.allow_tf32 is True), and a caller
    may have turned on TF32 matmuls: TF32 keeps 10 mantissa bits, an error near 3e-4 per
    product that grows over the denoising steps past the 1e-3 parity tolerance. Both sides of
    every comparison run under the same switches; they are restored afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="session")
def report():
    """`report(test, **numbers)`: print the numbers and append them to $OMNISTAGE_GPU_REPORT."""
    path = os.environ.get("OMNISTAGE_GPU_REPORT")

    def write(test: str, **numbers) -> None:
        line = json.dumps({"test": test, **numbers})
        print(line)
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")

    return write
