"""Models that come and go: when an idle model is due to be unloaded
(keep_alive), which model a load past runners.max_loaded unloads first,
and who holds the slots when none can go. Pure decisions over the loaded
models; the model service does the unloading.

A model is idle when no request is in flight and none came within its
keep_alive; one kept forever (keep_alive None) or with a request in flight
is never chosen. A model with no keep_alive (None) is never unloaded for
being idle, but may be to make room; one with keep_alive -1 (FOREVER)
never.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from typing import Any

from cartonstore.config.runners import FOREVER, show_keep_alive
from cartonstore.config.runners import keep_alive as keep_alive_setting
from cartonstore.config.values import BadValue
from cartonstore.errors import InvalidInput
from cartonstore.format.units import format_size

from .loaded_model import LOADING, READY, LoadedModel

# The load parameters an unloaded model is loaded again with on demand: how it ran, not where it came from.
RELOAD_PARAMETERS = ("config", "keep_alive")


def load_keep_alive(params: dict[str, Any], default: float | None) -> float | None:
    """A load's parameters.keep_alive (as [runners] keep_alive reads it), else ``default``."""
    if "keep_alive" not in params:
        return default
    try:
        return keep_alive_setting(params["keep_alive"])
    except BadValue as e:
        raise InvalidInput(f"parameter 'keep_alive': {e}", subject="keep_alive") from None


class Usage:
    """Requests in flight and the time of the last one, by model name: a
    request is counted from its arrival, across a version switch or a load
    on demand, whatever LoadedModel serves it."""

    def __init__(self) -> None:
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._last_used: dict[str, float] = {}

    def started(self, name: str) -> None:
        self._in_flight[name] += 1
        self._last_used[name] = time.monotonic()

    def ended(self, name: str) -> int:
        """The requests still in flight for ``name``."""
        left = self._in_flight[name] = self._in_flight[name] - 1
        if not left:
            del self._in_flight[name]
        self._last_used[name] = time.monotonic()
        return left

    def loaded(self, name: str) -> None:
        """A load counts as a use: its idle time starts now."""
        self._last_used[name] = time.monotonic()

    def in_flight(self, name: str) -> int:
        return self._in_flight.get(name, 0)

    def last_used(self, name: str) -> float:
        return self._last_used.get(name, 0.0)


def holds_runners(model: LoadedModel) -> bool:
    """READY with runners: what max_loaded counts and keep_alive unloads."""
    return model.state == READY and model.runners is not None


def is_idle(model: LoadedModel, usage: Usage) -> bool:
    return holds_runners(model) and not usage.in_flight(model.name)


def unload_due(model: LoadedModel, usage: Usage) -> float | None:
    """The monotonic time ``model`` goes if no request comes; None when it stays."""
    if not is_idle(model, usage) or model.keep_alive in (None, FOREVER):
        return None
    return usage.last_used(model.name) + model.keep_alive


def unload_at(model: LoadedModel, usage: Usage) -> float | None:
    """The index's ``unload_at``: the Unix time an idle model goes if no
    request comes; with requests in flight, keep_alive after now (at the
    soonest); None for a model kept until unloaded."""
    if not holds_runners(model) or model.keep_alive is None or model.keep_alive == FOREVER:
        return None
    now = time.monotonic()
    due = now + model.keep_alive if usage.in_flight(model.name) else usage.last_used(model.name) + model.keep_alive
    return round(time.time() + max(0.0, due - now), 3)


def idle_reason(model: LoadedModel) -> str:
    return f"unloaded: idle past its keep_alive {show_keep_alive(model.keep_alive)}"


def least_recently_used(models: Iterable[LoadedModel], usage: Usage, loading: str) -> LoadedModel | None:
    """The idle model a load of ``loading`` past max_loaded unloads first."""
    idle = [m for m in models if m.name != loading and is_idle(m, usage) and m.keep_alive != FOREVER]
    return min(idle, key=lambda m: usage.last_used(m.name), default=None)


def why_held(model: LoadedModel, usage: Usage) -> str | None:
    """Why a model that holds runners cannot be unloaded to make room; None: it can."""
    if model.state == LOADING:
        return "loading"
    if holds_runners(model) and usage.in_flight(model.name):
        return f"{usage.in_flight(model.name)} request(s) in flight"
    if holds_runners(model) and model.keep_alive == FOREVER:
        return "keep_alive -1"
    return None


def slot_holders(models: Iterable[LoadedModel], usage: Usage, loading: str) -> list[str]:
    """Each model holding a slot, and why it cannot go."""
    return [f"{m.name} ({why})" for m in models if m.name != loading and (why := why_held(m, usage))]


def memory_holders(models: Iterable[LoadedModel], usage: Usage, sizes: dict[str, int], loading: str) -> list[str]:
    """Each model whose runners hold memory, how much, and why it cannot go."""
    return [f"{m.name} {format_size(sizes[m.name])} ({why})" for m in models
            if m.name != loading and m.name in sizes and (why := why_held(m, usage))]
