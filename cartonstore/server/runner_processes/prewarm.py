"""Pre-warmed runners (``runners.prewarm``): for each built-in runner kind
named there and each device of ``runners.devices``, one spare runner
process that has already started its interpreter, imported its framework
(onnxruntime, torch) and made its GPU context, waiting in a sandbox of its
own for a model (waiting.py). A load takes it, so a model already in the
store pays for its own load only; another spare is started once that load
has settled (its runners ready, or the load failed), at most
REFILL_AT_MOST seconds later: started at once, the replacement's
interpreter and framework imports took CPU from the very load that took
its predecessor (on 2 cores, a warm load's 0.40 s became 0.50-0.64 s).

A spare is sandboxed like any runner, and given nothing of any model until
a load hands it one: a slot of its own, bound read-only, is all it may
read of models. Its command line names no model (the instance's arguments
come over its channel); the index and the log say which pid serves what.
A spare that exits unbidden is started again after a doubling delay.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from pathlib import Path

from cartonstore.config.runners import RunnerSettings
from cartonstore.system.backoff import doubling

from .process import RunnerFailed
from .sandbox import SandboxPolicy
from .settings import RESTART_DELAY_MAX, STDERR_LINES, InstanceSpec
from .waiting import Slots, WaitingRunner, start_waiting

log = logging.getLogger("cartonstore.server.runner_processes")
REFILL_AT_MOST = 30.0   # seconds after a take: a load that never says it settled does not starve the pool


class PrewarmPool:
    """Spares by (kind, device). ``programs``: each kind's command without
    its arguments (``python -m cartonstore.runner.backends.onnx``)."""

    def __init__(self, programs: Mapping[str, tuple[str, ...]], devices: tuple[str, ...], run_dir: Path,
                 slots: Slots, settings: RunnerSettings, sandbox: SandboxPolicy | None) -> None:
        self._programs = dict(programs)
        self._devices = devices
        self._run_dir = run_dir
        self._slots = slots
        self._settings = settings
        self._sandbox = sandbox
        self._spares: dict[tuple[str, str], WaitingRunner] = {}
        self._taken: dict[tuple[str, str], asyncio.Event] = {}
        self._settled: dict[tuple[str, str], asyncio.Event] = {}   # the load that took the last spare
        self._last_taken: dict[tuple[str, str], WaitingRunner] = {}
        self._keepers: list[asyncio.Task[None]] = []
        self._starting: set[asyncio.Future[WaitingRunner]] = set()   # spares being started now
        self._numbers = itertools.count(1)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._programs)

    def start(self) -> None:
        for kind in self._programs:
            for device in self._devices:
                self._taken[(kind, device)] = asyncio.Event()
                self._settled[(kind, device)] = asyncio.Event()
                self._keepers.append(asyncio.ensure_future(self._keep(kind, device)))

    def take(self, kind: str, device: str) -> WaitingRunner | None:
        """The spare of this kind on this device, if one is waiting; another
        is started in its place once the taker calls settled()."""
        spare = self._spares.get((kind, device))
        if spare is None or not spare.alive:
            return None
        del self._spares[(kind, device)]
        self._last_taken[(kind, device)] = spare
        self._settled[(kind, device)].clear()
        self._taken[(kind, device)].set()
        return spare

    def settled(self, kind: str, device: str, spare: WaitingRunner) -> None:
        """The load that took ``spare`` is done (ready or failed): its
        replacement may start. An older load that ends meanwhile (its own
        replacement came after REFILL_AT_MOST) does not start another."""
        if self._last_taken.get((kind, device)) is spare:
            del self._last_taken[(kind, device)]
            self._settled[(kind, device)].set()

    def status(self) -> list[dict[str, object]]:
        return [{"kind": kind, "device": device, "pid": spare.process.pid}
                for (kind, device), spare in tuple(self._spares.items()) if spare.alive]

    async def _keep(self, kind: str, device: str) -> None:
        key, failures = (kind, device), 0
        while True:
            if failures:
                delay = doubling(self._settings.restart_backoff, RESTART_DELAY_MAX, failures - 1)
                await asyncio.sleep(delay)
            label = f"spare-{kind}-{device.replace(':', '')}-{next(self._numbers)}"
            slot = self._slots.new(label)
            # its slot in its command line, for ps: the arguments it runs with come with its model
            spec = InstanceSpec([*self._programs[kind], "--model-dir", str(slot)], {},
                                self._run_dir / f"{label}.sock", device, self._sandbox, "", slot)
            # Closing while it starts: it stays in _starting, and close() waits for it and discards it
            # (its process and its slot). Only this keeper takes it out, once it holds what it gave: a
            # done-callback ran before the keeper did, and a close() between the two lost the spare.
            starting = asyncio.ensure_future(start_waiting(spec, label, STDERR_LINES,
                                                           program=self._programs[kind]))
            self._starting.add(starting)
            try:
                spare = await asyncio.shield(starting)
            except RunnerFailed as e:
                self._starting.discard(starting)
                failures += 1
                log.warning("cannot start a pre-warmed %s runner on %s: %s", kind, device, e.reason)
                continue
            self._starting.discard(starting)
            self._taken[key].clear()
            self._spares[key] = spare
            log.info("[%s] pre-warmed %s runner on %s: pid %d", label, kind, device, spare.process.pid)
            waits = [asyncio.ensure_future(self._taken[key].wait()), asyncio.ensure_future(spare.process.exit_seen())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            if self._spares.get(key) is spare:   # it exited before any load took it
                del self._spares[key]
                await spare.process.wait()
                failures += 1
                log.warning("[%s] pre-warmed %s runner exited unbidden: %s", label, kind, spare.process.exit_reason())
                await spare.discard()
            else:
                failures = 0
                try:
                    await asyncio.wait_for(self._settled[key].wait(), REFILL_AT_MOST)
                except asyncio.TimeoutError:
                    log.info("pre-warmed %s runner on %s: the load that took the last one has not settled in "
                             "%.0f s; starting another", kind, device, REFILL_AT_MOST)

    async def close(self) -> None:
        """Stop keeping spares and end those waiting, and those being
        started (a daemon that stops just after a refill began left that
        spare's slot behind)."""
        for keeper in self._keepers:
            keeper.cancel()
        starting = list(self._starting)
        await asyncio.gather(*self._keepers, return_exceptions=True)
        self._keepers.clear()
        spares, self._spares = list(self._spares.values()), {}
        for done in await asyncio.gather(*starting, return_exceptions=True):
            if isinstance(done, WaitingRunner) and done not in spares:
                spares.append(done)
        await asyncio.gather(*(spare.discard() for spare in spares), return_exceptions=True)

