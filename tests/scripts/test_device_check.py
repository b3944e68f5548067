"""scripts/device_check.sh runs once on a GPU machine lent for a few minutes: a misspelt test
path or benchmark flag would waste that run. Every test file and benchmark it names must
exist, the tests must collect, every benchmark must accept the flags (and choices) it is
given, and the steps' time limits must fit the 420 s the run is sized for. Nothing here runs
a test or a benchmark: collection and `--help` only."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_check.sh"
BUDGET_S = 420


def commands() -> list[str]:
    """The script's lines with backslash continuations joined, comments dropped."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    return [line.split(" #", 1)[0].strip() for line in text.splitlines() if not line.lstrip().startswith("#")]


def steps() -> list[tuple[str, int, list[str]]]:
    """(name, limit in s, command words) of each `step NAME SECONDS LOG CMD...` line."""
    out = []
    for line in commands():
        if line.startswith("step "):
            head = line.split("||")[0]
            try:
                words = shlex.split(head)
            except ValueError:  # a `python -c "` whose program spans lines: its words up to the quote
                words = shlex.split(head + '"')
            out.append((words[1], int(words[2]), words[4:]))
    return out


def test_the_steps_limits_fit_the_budget():
    limits = [secs for _, secs, _ in steps()]
    # The two bench_ar_cuda_graphs steps are alternatives (CUDA or not): count one.
    names = [name for name, _, _ in steps()]
    assert "imports" in names and names.index("imports") < names.index("GPU tests") < names.index("parity tests")
    alternatives = [secs for name, secs, _ in steps() if name.startswith("bench_ar_cuda_graphs")]
    assert sum(limits) - sum(alternatives) + max(alternatives) <= BUDGET_S


def named_tests() -> list[str]:
    return sorted({word for _, _, cmd in steps() for word in cmd if word.startswith("tests/")})


def test_named_tests_exist_and_collect(probe):
    paths = named_tests()
    assert paths, "the script names no tests"
    for path in paths:
        assert (ROOT / path).exists(), path
    code, output = probe["collect"]
    assert code == 0, output[-3000:]
    for path in paths:  # each named path contributes tests
        assert path in output, path


def benchmark_calls() -> list[tuple[str, list[str]]]:
    calls = []
    for _, _, cmd in steps():
        scripts = [i for i, word in enumerate(cmd) if re.fullmatch(r"bench_\w+\.py", word)]
        if scripts:
            calls.append((cmd[scripts[0]], cmd[scripts[0] + 1:]))
    return calls


# One interpreter for both checks (each imports torch and omnistage: ~5 s of CPU apiece on the
# 2-core machine): pytest's collection of the named tests (from the repo root), then each named
# benchmark run as `python SCRIPT --help` would (from benchmarks/); prints
# {"collect": [exit code, output], "help": {script: [exit code, stdout, stderr]}}.
PROBE = """
import contextlib, io, json, os, runpy, sys, traceback
import pytest
tests, scripts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *tests])
results = {"collect": [int(code), out.getvalue()], "help": {}}
os.chdir("benchmarks")
sys.path.insert(0, os.getcwd())
for script in scripts:
    sys.argv = [script, "--help"]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    results["help"][script] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    scripts = sorted({script for script, _ in benchmark_calls() if (ROOT / "benchmarks" / script).exists()})
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(named_tests()), json.dumps(scripts)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("script, args", benchmark_calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_named_benchmark_accepts_its_flags(probe, script, args):
    assert (ROOT / "benchmarks" / script).exists(), script
    code, stdout, stderr = probe["help"][script]
    assert code == 0, stderr[-3000:]
    usage = " ".join(stdout.split())  # argparse wraps long choice lists
    flag = None
    for word in args:
        if word.startswith("--"):
            assert word in usage, f"{script} has no {word}"
            flag = word
            continue
        choices = re.search(re.escape(flag) + r" \{([^}]*)\}", usage) if flag else None
        if choices and not word.startswith("$"):  # a value of a flag with choices: one of them
            assert word in [c.strip() for c in choices.group(1).split(",")], f"{script} {flag}: no choice {word!r}"
