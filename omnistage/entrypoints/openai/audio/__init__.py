"""POST /v1/audio/speech: text to speech, whole, chunked or as SSE events."""
