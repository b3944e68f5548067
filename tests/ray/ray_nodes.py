"""Which node of the test cluster (conftest.py) runs what."""

from __future__ import annotations


def node_names() -> dict[str, str]:
    """Node id -> the custom resource that names the node ("node_a" | "node_b")."""
    import ray

    return {node["NodeID"]: name for node in ray.nodes() if node["Alive"]
            for name in ("node_a", "node_b") if name in node["Resources"]}
