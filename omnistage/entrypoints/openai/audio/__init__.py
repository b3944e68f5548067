"""Audio routes: POST /v1/audio/speech (whole, chunked or SSE), /v1/audio/voices, WS /v1/audio/speech/stream."""
