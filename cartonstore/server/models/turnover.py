"""Models that come and go, the acting part of lifecycle.py: the requests
each model has in flight, the loop that unloads models idle past their
keep_alive, the room a load past runners.max_loaded or runners.max_memory
makes, the idle models memory pressure unloads (runners.pressure_psi,
pressure_cgroups), and loads on demand (runners.load_on_demand). The model service
owns one and lends it its unload and load.

What a load's runners will hold is unknown before they run, so
max_memory is kept after the fact: once a new model's runners are ready,
the memory of every runner is measured (system/memory_use.py: each one's
cgroup where it has one that accounts memory, else the resident sets of
its process tree) and least recently used idle models are unloaded until
the total fits; when none can go, the load fails and its runners stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cartonstore.config.values import duration_text, size_text
from cartonstore.errors import CartonStoreError, Unavailable
from cartonstore.format.units import format_size
from cartonstore.system.memory_pressure import LimitReclaims, host_memory_psi
from cartonstore.system.memory_use import cgroup_bytes, tree_rss
from cartonstore.system.single_flight import SingleFlight

from .lifecycle import (
    RELOAD_PARAMETERS,
    Usage,
    holds_runners,
    idle_reason,
    least_recently_used,
    memory_holders,
    slot_holders,
    unload_due,
)
from .loaded_model import LOADING, READY, LoadedModel
from .runtime import RunnerHost

log = logging.getLogger("cartonstore.server")
PRESSURE_TICK = 1.0   # seconds between readings of the pressure signs, and so between pressure unloads
PSI_SETTLE = 10.0     # avg10 averages the last 10 s: the time an unload takes to show in it


class Unload(Protocol):
    def __call__(self, name: str, why: str, reason: str, *, if_idle: LoadedModel | None = None) -> Awaitable[bool]: ...


class Turnover:
    def __init__(self, models: dict[str, LoadedModel], runner_host: RunnerHost, unload: Unload,
                 load: Callable[[str, dict[str, Any]], Awaitable[Any]], load_locks: Mapping[str, asyncio.Lock]) -> None:
        """models, load_locks: the service's own (read here, never written);
        unload, load: its ModelService._unload and load."""
        self.models, self.runner_host, self.settings = models, runner_host, runner_host.config
        self._unload, self._load, self._load_locks = unload, load, load_locks
        self.usage = Usage()   # requests by model name: what keep_alive and max_loaded go by
        self._due_changed = asyncio.Event()     # unload_idle() looks at the models again
        self._making_room = asyncio.Lock()      # loads past max_loaded choose what to unload one at a time
        self._on_demand = SingleFlight()

    def request_started(self, name: str) -> None:
        self.usage.started(name)

    def request_ended(self, name: str) -> None:
        if not self.usage.ended(name):
            self._due_changed.set()

    def loaded(self, model: LoadedModel, keep_alive: float | None, params: dict[str, Any]) -> None:
        """A load made ``model`` READY: its idle time starts now."""
        model.keep_alive = keep_alive
        model.reload_params = {k: params[k] for k in RELOAD_PARAMETERS if k in params}
        self.usage.loaded(model.name)
        self._due_changed.set()

    async def unload_idle(self) -> None:
        """Unload each model idle past its keep_alive, forever: sleeps until the
        soonest is due or a load or request changes when that is."""
        while True:
            self._due_changed.clear()
            now = time.monotonic()
            soonest: float | None = None
            for model in tuple(self.models.values()):
                due = unload_due(model, self.usage)
                if due is not None and due <= now:
                    try:
                        await self._unload(model.name, "idle", idle_reason(model), if_idle=model)
                    except CartonStoreError as e:
                        log.warning("could not unload idle model %s: %s", model.name, e)
                elif due is not None:
                    soonest = due if soonest is None else min(soonest, due)
            wait = None if soonest is None else max(0.0, soonest - time.monotonic())
            try:
                await asyncio.wait_for(self._due_changed.wait(), wait)
            except asyncio.TimeoutError:
                pass

    async def make_room(self, loading: str) -> None:
        """Before ``loading`` starts runners: within runners.max_loaded, unloading
        the least recently used idle models, else Unavailable naming what holds
        the slots."""
        limit = self.settings.max_loaded
        if not limit:
            return
        async with self._making_room:
            while True:
                others = [m for m in tuple(self.models.values()) if m.name != loading]
                if sum(1 for m in others if holds_runners(m) or m.state == LOADING) < limit:
                    return
                coldest = least_recently_used(others, self.usage, loading)
                if coldest is None:
                    holders = ", ".join(slot_holders(others, self.usage, loading))
                    raise Unavailable(f"runners.max_loaded {limit} reached and no loaded model is idle to unload: "
                                      f"held by {holders}", subject=loading)
                await self._unload(coldest.name, "max_loaded", f"unloaded: least recently used idle model, for "
                                   f"{loading!r} (runners.max_loaded {limit})", if_idle=coldest)

    async def fit_memory(self, model: LoadedModel) -> None:
        """Once a new ``model``'s runners are ready: within runners.max_memory,
        unloading the least recently used idle models, else its runners stop
        and Unavailable names what holds the memory."""
        if self.settings.max_memory is None or model.runners is None:
            return
        try:
            await self._fit_memory(model.name, self.settings.max_memory)
        except BaseException:
            runners, model.runners = model.runners, None   # the index gives the refusal, not "unloaded"
            await asyncio.shield(self.runner_host.stop(runners))
            raise

    async def _fit_memory(self, loading: str, limit: int) -> None:
        async with self._making_room:
            while True:
                sources = {m.name: m.runners.memory_sources() for m in tuple(self.models.values())
                           if m.runners is not None}
                sizes = await asyncio.to_thread(runner_memory, sources)
                total = sum(sizes.values())
                if total <= limit:
                    return
                others = [m for m in tuple(self.models.values()) if m.name != loading]
                coldest = least_recently_used(others, self.usage, loading)
                if coldest is None:
                    holders = ", ".join(memory_holders(others, self.usage, sizes, loading)) or "nothing else"
                    own = format_size(sizes.get(loading, 0))
                    raise Unavailable(f"runners.max_memory {size_text(limit)} exceeded: the runners hold "
                                      f"{format_size(total)}, {own} of it for {loading!r}, and no loaded model is idle "
                                      f"to unload: held by {holders}", subject=loading)
                await self._unload(coldest.name, "max_memory", f"unloaded: least recently used idle model, for "
                                   f"{loading!r} (runners.max_memory {size_text(limit)})", if_idle=coldest)

    async def unload_under_pressure(self) -> None:
        """Forever, once a second (when runners.pressure_psi or
        pressure_cgroups is set): under memory pressure, unload the least
        recently used idle model. A runner cgroup's reclaims count from
        the first time it is read; after an unload the host's avg10 (which
        lags by its 10 s) is let settle."""
        psi_limit, by_cgroups = self.settings.pressure_psi, self.settings.pressure_cgroups
        if not psi_limit and not by_cgroups:
            return
        reclaims, watch = LimitReclaims(), _PressureWatch()
        reading: asyncio.Future[tuple[float | None, dict[tuple[str, Path], int]]] | None = None
        try:
            while True:
                await asyncio.sleep(PRESSURE_TICK)
                cgroups = {m.name: [c for _, c in m.runners.memory_sources() if c is not None]
                           for m in tuple(self.models.values()) if m.runners is not None} if by_cgroups else {}
                # shielded: a cancelled watcher waits for its reading thread before the eventfds close
                reading = asyncio.ensure_future(asyncio.to_thread(read_pressure, bool(psi_limit), cgroups, reclaims))
                psi, counts = await asyncio.shield(reading)
                await self._relieve(watch, watch.signs(psi_limit, psi, counts))
        finally:
            if reading is not None:
                await asyncio.wait([reading])
            reclaims.close()

    async def _relieve(self, watch: _PressureWatch, signs: list[str]) -> None:
        """Unload the least recently used idle model when ``signs`` say memory is short."""
        if not signs:
            watch.stuck = False
            return
        models = tuple(self.models.values())
        coldest = least_recently_used(models, self.usage, "")
        if coldest is None:
            if not watch.stuck:
                holders = ", ".join(slot_holders(models, self.usage, "")) or "no model"
                log.warning("memory pressure (%s), and no loaded model is idle to unload: held by %s",
                            "; ".join(signs), holders)
            watch.stuck = True
            return
        log.warning("memory pressure (%s): unloading %s, idle %.0fs", "; ".join(signs), coldest.name,
                    time.monotonic() - self.usage.last_used(coldest.name))
        try:
            await self._unload(coldest.name, "pressure", f"unloaded: least recently used idle model, under "
                               f"memory pressure ({signs[0]})", if_idle=coldest)
        except CartonStoreError as e:
            log.warning("could not unload %s under memory pressure: %s", coldest.name, e)
        watch.settled_at = time.monotonic() + PSI_SETTLE

    def loads_on_demand(self, name: str) -> bool:
        """An infer to ``name`` may load it: runners.load_on_demand is on and
        no model of that name is loaded (never, unloaded, or loading now). A
        failed load is not tried again by every request: its error stands."""
        if not self.settings.load_on_demand:
            return False
        model = self.models.get(name)
        return model is None or model.unloaded or model.state == LOADING

    async def load_on_demand(self, name: str) -> None:
        """Load ``name`` for an infer (its last load's config and keep_alive),
        waiting at most runners.load_wait; concurrent callers share one load,
        and one already under way. NotFound when the store does not hold it."""
        async def load_once() -> None:
            lock = self._load_locks.get(name)
            if lock is not None and lock.locked():   # a load already under way: it is the one
                async with lock:
                    pass
            model = self.models.get(name)
            if model is None or model.serving_state != READY:
                await self._load(name, dict(model.reload_params) if model is not None else {})
        wait = self.settings.load_wait
        try:
            await asyncio.wait_for(self._on_demand.run(name, load_once), wait)
        except asyncio.TimeoutError:
            raise Unavailable(f"model {name!r} is still loading on demand after runners.load_wait "
                              f"{duration_text(wait)}; retry later", subject=name) from None


@dataclass
class _PressureWatch:
    """What the pressure watcher remembers between readings."""

    hits: dict[Path, int] = field(default_factory=dict)   # each runner cgroup's reclaims at the last reading
    settled_at: float = 0.0   # host PSI counts again from then (after an unload)
    stuck: bool = False       # pressure with nothing idle to unload, logged once

    def signs(self, psi_limit: float, psi: float | None, counts: dict[tuple[str, Path], int]) -> list[str]:
        """What in this reading says memory is short."""
        signs = []
        if psi_limit and psi is not None and psi >= psi_limit and time.monotonic() >= self.settled_at:
            signs.append(f"host memory pressure: /proc/pressure/memory some avg10 {psi:g}% (runners.pressure_psi "
                         f"{psi_limit:g})")
        for (name, cgroup), count in counts.items():
            if count > self.hits.get(cgroup, count):
                signs.append(f"the runner cgroup of {name} at its memory limit: reclaimed {count - self.hits[cgroup]} "
                             f"time(s)")
        self.hits = {cgroup: count for (_, cgroup), count in counts.items()}
        return signs


def read_pressure(psi: bool, cgroups: Mapping[str, list[Path]],
                  reclaims: LimitReclaims) -> tuple[float | None, dict[tuple[str, Path], int]]:
    """The host's memory some-avg10 (when ``psi``) and the reclaims each
    runner cgroup's limit caused, by (model name, cgroup): in a worker
    thread, it reads /proc and /sys."""
    counts = reclaims.read(cgroup for dirs in cgroups.values() for cgroup in dirs)
    return (host_memory_psi() if psi else None), {(name, cgroup): counts[cgroup] for name, dirs in cgroups.items()
                                                  for cgroup in dirs if cgroup in counts}


def runner_memory(sources: Mapping[str, list[tuple[int | None, Path | None]]]) -> dict[str, int]:
    """Bytes the runners of each model hold (ModelRunners.memory_sources()
    by model name): in a worker thread, it reads /proc and /sys."""
    trees = tree_rss([pid for pairs in sources.values() for pid, cgroup in pairs if pid is not None and cgroup is None])
    out = {}
    for name, pairs in sources.items():
        total = 0
        for pid, cgroup in pairs:
            charged = cgroup_bytes(cgroup) if cgroup is not None else None
            total += charged if charged is not None else trees.get(pid, 0) if pid is not None else 0
        out[name] = total
    return out
