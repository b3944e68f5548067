"""Shared fixtures: the zoo is built once per machine into a cache dir in the repo.

The whole run uses one intra-op thread (`pytest_configure`): tiny models are bound by per-op
overhead, and on a shared 2-core machine a second OpenMP thread made a tiny model's step 10-15x
slower (its spinning fights every other process for the cores).

Parallel runs (`scripts/test.sh` passes `-n 2 --dist loadfile` to pytest-xdist): each worker
runs whole files (so a module's server or engine fixture starts once), and the workers take the
longest files first (`pytest_collection_modifyitems`), so the two finish together rather than
one waiting on a long file picked up last. File times come from earlier runs on this machine
(pytest's cache), else from `tests/file_times.json` (measured on the 2-core reference machine,
so a fresh clone or CI orders well too); a file never timed counts as long. Refresh the
committed table after a full run with `python tests/conftest.py`."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

ZOO_CACHE = Path(__file__).resolve().parent.parent / ".omnistage-cache" / "zoo"
DURATIONS_KEY = "omnistage/module_durations"
FILE_TIMES = Path(__file__).resolve().parent / "file_times.json"

# Every model is a local zoo folder: a path the Hub is asked about anyway (a made-up model_path,
# a missing folder) must fail at once, not after huggingface_hub's ~25 s of retries offline.
# Set at import, before any test module imports huggingface_hub (it reads this once).
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config):
    # OMP_NUM_THREADS reaches every process the tests start (servers, ranks, Ray nodes) through
    # the environment; this process may have imported torch already, so it is told directly too.
    # A value set by whoever runs the suite wins.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if getattr(config, "cache", None) is not None and "PYTEST_XDIST_WORKER" not in os.environ:
        config.pluginmanager.register(_FileTimes(config), "omnistage-file-times")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _scope(nodeid: str) -> str:
    """What one xdist worker runs as a unit: a file, except that the Ray files go together, so
    one worker starts the session's two-node cluster (tests/ray/conftest.py) and the other none."""
    module = _module(nodeid)
    return "tests/ray" if module.startswith("tests/ray/") else module


class _FileTimes:
    """Sums each test file's setup + call + teardown time over the run (in an xdist run, the
    controller receives every worker's reports) and saves it in pytest's cache at the end."""

    def __init__(self, config) -> None:
        self.config = config
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[_module(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        if self.seconds:
            known = self.config.cache.get(DURATIONS_KEY, {})
            known.update({m: round(s, 2) for m, s in self.seconds.items()})
            self.config.cache.set(DURATIONS_KEY, known)


def pytest_collection_modifyitems(config, items):
    # Only in xdist workers (all of them sort alike, as xdist requires): a serial run keeps the
    # files in their usual order.
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    known = json.loads(FILE_TIMES.read_text()) if FILE_TIMES.exists() else {}
    if getattr(config, "cache", None) is not None:
        known.update(config.cache.get(DURATIONS_KEY, {}))
    seconds: dict[str, float] = defaultdict(float)
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        module, scope = _module(item.nodeid), _scope(item.nodeid)
        if first_seen.setdefault(module, i) == i:
            seconds[scope] += known.get(module, float("inf"))
        first_seen.setdefault(scope, i)
    # longest first; a file with no record counts as long (it may be new and slow); items keep
    # their order within a scope (module fixtures, and tests written to run in file order)
    items.sort(key=lambda item: (-seconds[_scope(item.nodeid)], first_seen[_scope(item.nodeid)],
                                 first_seen[_module(item.nodeid)]))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: the device check runs without it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with `_scope` as the unit, handed out in collection order (longest
    first, above) rather than xdist's default of most tests first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestScopeFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    config.option.loadscopereorder = False
    return LongestScopeFirst(config, log)


@pytest.fixture(scope="session")
def zoo():
    """`zoo(name, size="tiny", seed=0)` -> path of the built zoo checkpoint (built once, cached on
    disk); another seed gives other weights of the same shapes."""
    from omnistage.testing import ensure

    def get(name: str, size: str = "tiny", seed: int = 0) -> Path:
        return ensure(name, size=size, seed=seed, cache_dir=ZOO_CACHE)

    return get


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for the module, restored after it, whatever OMP_NUM_THREADS the
    run was given. Tiny models are bound by per-op overhead: extra threads cost more in start-up
    and OpenMP spinning than they save in math (the Wan parity file ran 5x longer with 2 threads
    on a shared 2-core machine). Folders of tiny-model tests turn it on for every module in their
    conftest.py."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


if __name__ == "__main__":
    # Copy this machine's file times (pytest's cache, written by every full run) into the
    # committed table that orders parallel runs on a fresh clone.
    cached = Path(__file__).resolve().parent.parent / ".pytest_cache" / "v" / DURATIONS_KEY
    root = Path(__file__).resolve().parent.parent
    times = {m: s for m, s in json.loads(cached.read_text()).items() if (root / m).exists()}  # not deleted files
    FILE_TIMES.write_text(json.dumps(dict(sorted(times.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
    print(f"{FILE_TIMES}: {len(times)} files, {sum(times.values()):.0f} s in all")
