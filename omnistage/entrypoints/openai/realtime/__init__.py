"""WS /v1/realtime: OpenAI's Realtime protocol (GA event names), turn-based, on omni models."""
