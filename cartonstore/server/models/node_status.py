"""GET /v1/node: what this node's store holds and whether it is full, for
schedulers and operators; the same figures /metrics gives as series.

Reads the index and the filesystem: run it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping

from cartonstore.store import Store
from cartonstore.store.gc.plan import GcPolicy, budget_lines, disk_free


def node_status(store: Store, budget: GcPolicy, interval: float, served: Mapping[str, int]) -> dict:
    """``budget``: the [gc] settings the daemon collects by every ``interval``
    seconds; ``served``: bytes served by kind of caller (metrics.SERVED_KINDS)."""
    outcome = store.index.last_gc_outcome()
    over = outcome.over_budget if outcome is not None else None
    return {
        "models": [m.as_json() for m in store.index.model_states()],
        "budget": {"max_size": budget.max_size, "min_free": budget.min_free, "grace": budget.grace,
                   "interval": interval},
        "store": {"bytes": store.index.stored_bytes(), "filesystem_free": disk_free(store.root)},
        "over_budget": over is not None,
        "over_budget_reason": {**over, "lines": budget_lines({"over_budget": over})} if over is not None else None,
        "last_gc": outcome.as_json() if outcome is not None else None,
        "served_bytes": dict(served),
        "sources": [{"kind": f.kind, **f.as_json(), "hit_ratio": f.hit_ratio} for f in store.source_bytes()],
    }
