"""`ensure` builds a checkpoint once into the cache, also when several callers ask at once
(parallel test workers share the cache folder)."""

from __future__ import annotations

import threading
import time

from omnistage.testing import zoo


def test_concurrent_callers_wait_for_one_build(tmp_path, monkeypatch):
    builds = []

    def builder(out_dir, size, seed):
        builds.append(size)
        time.sleep(0.3)  # long enough for the other caller to arrive while this one builds
        (out_dir / "weights.bin").write_bytes(b"x")

    monkeypatch.setitem(zoo._ZOO, "fake", zoo.ZooModel("fake", "ar", "none", builder))
    monkeypatch.setattr(zoo, "_load_builders", lambda: None)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(zoo.ensure("fake", cache_dir=tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == ["tiny"]
    assert len(set(paths)) == 1 and (paths[0] / "weights.bin").read_bytes() == b"x"
    assert (paths[0] / ".complete").exists()
