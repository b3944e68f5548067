"""How a child process ended, and whether the requests it ran are to blame: an exit code or a
fatal signal of its own is a crash; SIGKILL or SIGTERM from outside (an operator, the OOM
killer, our own stop) is not."""

from __future__ import annotations

import os
import signal
import time

import pytest

from omnistage.runtime import process


def sleeper() -> None:
    process.prepare_child()
    time.sleep(60)


def exits_3() -> None:
    os._exit(3)


def segfaults() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


@pytest.mark.parametrize("target, sent, how, crashed", [
    (exits_3, None, "exit code 3", True),
    (segfaults, None, "killed by signal 11 (SIGSEGV)", True),
    (sleeper, signal.SIGKILL, "killed by signal 9 (SIGKILL)", False),
    (sleeper, signal.SIGTERM, "killed by signal 15 (SIGTERM)", False),  # unwound by prepare_child
])
def test_describe_exit_says_how_and_whether_it_crashed(target, sent, how, crashed):
    proc = process.spawn(target, (), "omnistage-test", daemon=True)
    try:
        if sent is not None:
            time.sleep(1.0)  # past prepare_child
            os.kill(proc.pid, sent)
        proc.join(60)
        assert process.describe_exit(proc) == (how, crashed)
    finally:
        process.stop([proc], timeout_s=0)
