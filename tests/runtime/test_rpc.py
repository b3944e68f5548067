"""runtime/rpc.py: an object's async methods and streams served over a pipe (host and
clients on one loop here; the API server processes run the same ends in two processes)."""

from __future__ import annotations

import asyncio
import os
import uuid

import numpy as np
import pytest

from omnistage.core.errors import EngineUnavailableError, RequestError
from omnistage.runtime import process
from omnistage.runtime.rpc import RpcClient, RpcHost


class Served:
    def __init__(self):
        self.level = None
        self.closed_streams: list[int] = []

    async def add(self, a: int, b: int = 0) -> int:
        return a + b

    async def refuse(self) -> None:
        raise RequestError("size", "size: too big")

    async def set_level(self, level: int | None) -> None:
        self.level = level

    async def frames(self, n: int, side: int = 8):
        try:
            for i in range(n):
                yield np.full((side, side), i, dtype=np.float32)
                await asyncio.sleep(0.01)  # a stream that only a cancel ends soon
        finally:
            self.closed_streams.append(n)

    async def secret(self) -> str:
        return "not served"


def leftover(prefix: str) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(prefix)] if os.path.isdir("/dev/shm") else []


async def connected(host: RpcHost, prefix: str, on_lost=None) -> RpcClient:
    here, there = process.pipe(duplex=True)
    host.attach(there, prefix)
    client = RpcClient(here, prefix, on_lost=on_lost)
    client.start()
    await asyncio.sleep(0.05)  # the host's first state message
    return client


def test_calls_streams_state_and_typed_errors():
    async def main():
        served = Served()
        host = RpcHost(served, ["add", "refuse", "set_level"], ["frames"], state=["level"])
        prefix = f"omnistage-test-rpc-{uuid.uuid4().hex[:8]}-"
        a, b = await connected(host, prefix + "a-"), await connected(host, prefix + "b-")
        assert await a.call("add", 2, b=3) == 5
        with pytest.raises(RequestError) as refused:  # the field travels with it
            await a.call("refuse")
        assert refused.value.param == "size"
        with pytest.raises(AttributeError, match="not served"):
            await a.call("secret")
        big = [f async for f in a.stream("frames", 3, side=256)]  # 256 KiB each: through shared memory
        assert [int(f[0, 0]) for f in big] == [0, 1, 2] and big[0].shape == (256, 256)
        await a.call("set_level", 1)
        await asyncio.sleep(0.05)
        assert a.state == b.state == {"level": 1}  # every client hears of it
        a.close()
        b.close()
        await asyncio.sleep(0.05)
        host.close()
        assert leftover(prefix) == []

    asyncio.run(main())


def test_leaving_a_stream_or_dying_cancels_it_on_the_host():
    async def main():
        served = Served()
        host = RpcHost(served, [], ["frames"])
        prefix = f"omnistage-test-rpc-{uuid.uuid4().hex[:8]}-"
        client = await connected(host, prefix)
        stream = client.stream("frames", 1000)
        assert int((await stream.__anext__())[0, 0]) == 0
        await stream.aclose()  # the client left: the host's generator ends (an engine abort)
        for _ in range(50):
            if served.closed_streams:
                break
            await asyncio.sleep(0.01)
        assert served.closed_streams == [1000]

        stream = client.stream("frames", 2000)
        await stream.__anext__()
        client.close()  # the client's process going away looks the same to the host
        for _ in range(50):
            if len(served.closed_streams) == 2:
                break
            await asyncio.sleep(0.01)
        assert served.closed_streams == [1000, 2000]
        host.close()

    asyncio.run(main())


def test_a_lost_host_fails_what_the_client_waits_for():
    async def main():
        lost = []
        host = RpcHost(Served(), ["add"], ["frames"])
        client = await connected(host, f"omnistage-test-rpc-{uuid.uuid4().hex[:8]}-", on_lost=lambda: lost.append(1))
        stream = client.stream("frames", 10_000)
        await stream.__anext__()
        host.close()
        with pytest.raises(EngineUnavailableError):
            async for _ in stream:
                pass
        with pytest.raises(EngineUnavailableError):
            await client.call("add", 1)
        assert lost == [1]

    asyncio.run(main())
