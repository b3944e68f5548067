"""The ground floor every layer imports and that imports nothing else of ours: payload and
request/output types (types.py), typed errors (errors.py), the component registry
(registry.py) and device helpers (device.py)."""
