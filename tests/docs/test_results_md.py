"""benchmarks/RESULTS.md: every section names the exact command that made it, and that
command's script exists (so a table can always be remade or questioned)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def sections(path: Path = RESULTS) -> dict[str, str]:
    parts = re.split(r"(?m)^## (.*)\n", path.read_text())
    return dict(zip(parts[1::2], parts[2::2]))


def commands(body: str) -> list[str]:
    first = body.strip().split("\n\n")[0]
    match = re.match(r"Commands?( \([^)]*\))?: ((?:`[^`]+`(?:, )?)+)", first)
    return re.findall(r"`([^`]+)`", match.group(2)) if match else []


def test_every_section_names_its_command_and_the_script_exists():
    found = sections()
    assert len(found) >= 10
    for heading, body in found.items():
        cmds = commands(body)
        assert cmds, f"section {heading!r} does not start with `Command: ...`"
        for cmd in cmds:
            argv = shlex.split(cmd)
            assert argv[0] == "python" and argv[1].startswith("benchmarks/"), (heading, cmd)
            assert (ROOT / argv[1]).is_file(), f"{heading!r}: {argv[1]} does not exist"


def test_run_all_runs_existing_scripts_only():
    text = (ROOT / "benchmarks" / "run_all.sh").read_text()
    scripts = re.findall(r"^\s*run (benchmarks/\S+\.py)", text, re.M)
    assert len(scripts) >= 10
    for script in scripts:
        assert (ROOT / script).is_file(), script


def test_write_section_records_the_command(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setattr(common, "RESULTS", tmp_path / "RESULTS.md")
    monkeypatch.setattr(common, "machine_line", lambda: "machine")
    monkeypatch.setattr(sys, "argv", ["bench_x.py", "--models", "a b"])
    common.write_section("X", "benchmarks/bench_x.py", "| table |")
    body = sections(tmp_path / "RESULTS.md")["X"]
    assert commands(body) == ["python benchmarks/bench_x.py --models 'a b'"]

