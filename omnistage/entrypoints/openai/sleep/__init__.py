"""POST /v1/omni/sleep, POST /v1/omni/wakeup, GET /v1/omni/is_sleeping: free the device between
bursts (RL rollouts, shared machines) without stopping the server."""
