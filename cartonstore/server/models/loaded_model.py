"""A model as the daemon holds it: its load state, runners and pin, and the
lease answers it hands out. Plain data, shared by the service and the API."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cartonstore.format.carton_toml import CartonConfig, TensorSpec
from cartonstore.server.runner_processes import ModelRunners
from cartonstore.store.metadata.lease_rows import LeaseRow
from cartonstore.store.metadata.names import PIN_PREFIX, SWITCH_PREFIX

from .batcher import DynamicBatcher
from .runtime import files_only_note
from .sequences import SequenceRouter

READY, LOADING, UNAVAILABLE = "READY", "LOADING", "UNAVAILABLE"


@dataclass
class LoadedModel:
    name: str
    digest: str | None = None
    state: str = LOADING
    reason: str = ""
    config: dict | None = None          # the load's Triton config
    carton: CartonConfig | None = None  # its carton.toml
    runners: ModelRunners | None = None  # None: loaded as files only (reason says why)
    max_batch_size: int = 0             # > 0: inputs' first dimension is a batch of at most this
    batcher: DynamicBatcher | None = None  # the load's dynamic_batching, over these runners
    sequences: SequenceRouter | None = None  # the load's sequence_batching, over these runners
    response_cache: bool = False        # its answers are kept in the daemon's response cache
    keep_alive: float | None = None     # idle seconds before it is unloaded (lifecycle.py)
    reload_params: dict[str, Any] = field(default_factory=dict)  # what a load on demand loads it with again
    unloaded: bool = False              # UNAVAILABLE because it was unloaded (not a failed load)

    @property
    def request_inputs(self) -> Sequence[TensorSpec] | None:
        """The inputs a request gives: the carton's, but for the control
        inputs its sequence batching fills."""
        inputs = self.carton.inputs if self.carton is not None else None
        if inputs is None or self.sequences is None:
            return inputs
        return tuple(spec for spec in inputs if spec.name not in self.sequences.policy.names)

    @property
    def serving_state(self) -> str:
        """READY only while the runners are (a dead runner shows here)."""
        if self.state != READY or self.runners is None:
            return self.state
        return self.runners.state

    def as_index_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"name": self.name, "state": self.serving_state, "reason": self.reason}
        if self.runners is not None and self.runners.reason:
            row["reason"] = self.runners.reason
        if self.digest:
            row["version"] = self.digest
        if self.runners is not None:
            row["restarts"] = self.runners.restarts
            row["sandbox"] = self.runners.sandbox
            row["pids"] = self.runners.pids   # ps shows a pre-warmed runner's slot, not its model: this says
        return row


@dataclass
class Granted:
    lease: LeaseRow
    where: str    # the model directory (a str: leases are answered thousands of times a second)

    @property
    def path(self) -> Path:
        return Path(self.where)

    def as_json(self) -> dict[str, Any]:
        return {"lease": self.lease.id, "path": self.where, "manifest_sha256": self.lease.carton,
                "expires_at": self.lease.expires_at if math.isfinite(self.lease.expires_at) else None}


OWNED_LEASE_PREFIXES = (PIN_PREFIX, SWITCH_PREFIX)   # leases daemons take and renew themselves


def switch_id(owner: str, name: str) -> str:
    """The lease on the version this daemon serves ``name`` with while it switches to another."""
    return f"{SWITCH_PREFIX}{owner}:{name}"


def ready_reason(model: LoadedModel) -> str:
    """What the index says of a READY model: nothing, or that it runs no runner."""
    return "" if model.runners is not None else files_only_note(model.carton.runner.runner_name)  # type: ignore[union-attr]  # READY: loaded


def triton_load_failure(name: str, message: str) -> str:
    """A load failure as Triton words it ("failed to load 'x'"), ours after."""
    prefix = f"failed to load {name!r}"
    return message if message.startswith(prefix) else f"{prefix}: {message}"


def triton_unknown_model(name: str, version: str | None = None) -> str:
    """Triton's words for a model (version) it does not serve."""
    which = repr(name) if version is None else f"{name!r} version {version}"
    return f"Request for unknown model: {which} is not found"
