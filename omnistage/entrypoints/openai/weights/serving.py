"""Weight updates over the engine (`AsyncOmni.update_weights`)."""

from __future__ import annotations

from typing import Any

from omnistage.entrypoints.openai.errors import APIError, from_value_error, unavailable
from omnistage.entrypoints.openai.weights.protocol import UpdateWeightsRequest, UpdateWeightsResponse


class WeightsServing:
    def __init__(self, engine: Any):
        self.engine = engine

    async def update_weights(self, body: UpdateWeightsRequest) -> UpdateWeightsResponse:
        if self.engine is None or not hasattr(self.engine, "update_weights"):
            raise APIError(501, "this engine cannot update its weights", code="not_implemented")
        try:
            num = await self.engine.update_weights(body.stage, body.path, timeout_s=body.timeout_s)
        except ValueError as e:  # an unknown stage, a path that is no checkpoint of it: nothing changed
            raise from_value_error(e) from None
        except TimeoutError as e:
            raise unavailable(f"{e}; the weights are unchanged", code="update_timeout") from None
        except RuntimeError as e:  # a stage that cannot (asleep, quantized, a backend without it)
            raise APIError(409, f"update failed: {e}", code="update_failed") from None
        name = next(s.name for s in self.engine.spec.stages if body.stage in (s.id, s.name))
        return UpdateWeightsResponse(stage=name, num_tensors=num)
