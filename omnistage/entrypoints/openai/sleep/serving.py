"""Sleep and wake over the engine (`AsyncOmni.sleep` / `wake_up`)."""

from __future__ import annotations

from typing import Any

from omnistage.entrypoints.openai.errors import APIError, unavailable
from omnistage.entrypoints.openai.sleep.protocol import SleepRequest, SleepState


class SleepServing:
    def __init__(self, engine: Any):
        self.engine = engine

    def _engine(self) -> Any:
        if self.engine is None or not hasattr(self.engine, "sleep"):
            raise APIError(501, "this engine cannot sleep", code="not_implemented")
        return self.engine

    def state(self) -> SleepState:
        engine = self._engine()
        return SleepState(is_sleeping=engine.is_sleeping, level=engine.sleep_level)

    async def sleep(self, body: SleepRequest) -> SleepState:
        engine = self._engine()
        try:
            freed = await engine.sleep(body.level, body.timeout_s)
        except TimeoutError as e:
            raise unavailable(f"{e}; the engine stays awake", code="sleep_timeout") from None
        except RuntimeError as e:  # a stage that cannot sleep (a backend without it, CUDA graphs)
            raise APIError(409, f"sleep failed, the engine stays awake: {e}", code="sleep_failed") from None
        return SleepState(is_sleeping=True, level=body.level, freed_bytes=freed)

    async def wake_up(self) -> SleepState:
        engine = self._engine()
        try:
            await engine.wake_up()
        except RuntimeError as e:
            raise APIError(500, f"wake-up failed on a stage (it serves again once rebuilt): {e}",
                           code="wakeup_failed") from None
        return SleepState(is_sleeping=False)
