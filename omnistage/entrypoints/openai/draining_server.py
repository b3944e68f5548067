"""uvicorn's server, telling the app when it starts to stop.

uvicorn gives in-flight requests `timeout_graceful_shutdown` seconds and then cancels them,
which cuts a stream mid-body (a truncated chunked response, a WebSocket without a close
frame). Told when the stop begins, the gateway ends the streams still open a moment before
that (`EngineGateway.drain_after`), each in its route's own error shape.
"""

from __future__ import annotations

from typing import Any

import uvicorn

DRAIN_MARGIN_S = 1.0
"""How long before the grace period ends the open streams get their closing error event (at
most a tenth of the grace period)."""


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, gateway: Any):
        super().__init__(config)
        self.gateway = gateway

    async def shutdown(self, sockets: Any = None) -> None:
        grace = self.config.timeout_graceful_shutdown
        if grace is not None:
            self.gateway.drain_after(grace - min(DRAIN_MARGIN_S, grace / 10))
        await super().shutdown(sockets)
