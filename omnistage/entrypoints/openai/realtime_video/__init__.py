"""WS /v1/realtime/video: one video generation per session, streamed as fragmented MP4 chunks."""
