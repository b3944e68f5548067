"""/v1/videos: async video jobs, and POST /v1/videos/sync for a blocking MP4."""
