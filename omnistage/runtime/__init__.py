"""Everything that crosses a process or node boundary, written once: `channel` (one
serializer; inline, shm, Ray transports), `process` (spawn, stop, describe an exit),
`loop` (serve an engine's commands and steps), `endpoint` (inline and process stages),
`ray` (actors, placement groups, Ray stages) and `supervisor` (the requests a stage holds,
its deaths, hangs and restarts). It knows no model family, no engine kind and no HTTP."""
