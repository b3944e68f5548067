"""The docs site builds with `mkdocs build --strict` (no broken link or anchor), and its
generated pages are what scripts/gen_docs.py makes from the code today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_docs  # noqa: E402


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("material", reason="mkdocs-material is a dev dependency: pip install -e '.[dev]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "deploy" / "reference" / "index.html").exists()


@pytest.mark.parametrize("path", list(gen_docs.pages()), ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_page_is_current(path):
    assert path.read_text() == gen_docs.pages()[path], (
        f"{path.relative_to(ROOT)} is stale: run `python scripts/gen_docs.py`")


def test_every_deploy_field_is_documented():
    from omnistage.config.deploy_fields import PIPELINE_FIELDS, STAGE_FIELDS

    source = gen_docs.DEPLOY_FIELDS.read_text()
    documented = {**gen_docs.field_docstrings(source, "StageDeployConfig"),
                  **gen_docs.field_docstrings(source, "PipelineDeployConfig")}
    missing = [name for name in (*STAGE_FIELDS, *PIPELINE_FIELDS) if not documented.get(name)]
    assert not missing, f"deploy fields without a docstring under them: {missing}"
