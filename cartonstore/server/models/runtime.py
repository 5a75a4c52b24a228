"""Runner processes of the daemon's loaded models: start them for a load,
stop them on unload or after a version switch.

The daemon's [runners] settings (config/runners.py) are the supervisor's
too; runner_plan.py decides what to run.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cartonstore.carton.from_files import RUNNERLESS_FORMATS, no_runner_serves
from cartonstore.config.runners import RunnerSettings
from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import CartonConfig
from cartonstore.runner.builtin_runners import program
from cartonstore.server.runner_processes import (
    InstanceSpec,
    ModelRunners,
    clean_stale_sockets,
    daemon_run_dir,
    ensure_run_dir,
)
from cartonstore.server.runner_processes.instance import FirstProcess
from cartonstore.server.runner_processes.prewarm import PrewarmPool
from cartonstore.server.runner_processes.process import RunnerFailed, RunnerProcess
from cartonstore.server.runner_processes.sandbox import (
    CGROUP_PREFIX,
    SandboxPolicy,
    prerequisites,
)
from cartonstore.server.runner_processes.settings import STDERR_LINES, physical_gpu
from cartonstore.server.runner_processes.waiting import (
    Slots,
    WaitingRunner,
    hand_model,
    slots_dir,
    start_waiting,
    with_model_dir,
)
from cartonstore.server.tensors.arena import TensorArena
from cartonstore.store.root.layout import StoreLayout
from cartonstore.store.root.owner import owner_token
from cartonstore.system.cgroups import remove_stale as remove_stale_cgroups
from cartonstore.system.cgroups import take_delegation

from .model_config import answer_limit
from .runner_plan import (
    RunnerPlan,
    instance_devices,
    instance_specs,
    plan_runner,
    probe_framework,
    runner_opts,
    sandbox_policy,
)

log = logging.getLogger("cartonstore.server")


def files_only_note(runner_name: str) -> str:
    """Why a model loaded with no runner (a format no runner serves, or a
    runner_name no [runners] table names), and what to do."""
    return f"loaded as files only: {no_runner_reason(runner_name)}"


def no_runner_reason(runner_name: str) -> str:
    if runner_name in RUNNERLESS_FORMATS:
        return no_runner_serves(runner_name)
    return (f"no runner is configured for runner_name {runner_name!r} "
            f"(add a [runners.{runner_name}] table to run it)")


class RunnerHost:
    """Starts and stops the runners of loaded models. One per daemon."""

    def __init__(self, config: RunnerSettings, runners_dir: Path, tmp_dir: Path, *,
                 on_change: Callable[[], None] | None = None, arena_size: int = 0,
                 max_request_size: int = 256 << 20) -> None:
        """runners_dir: where each daemon sharing the store keeps its runners'
        sockets; tmp_dir: the store's tmp/, whose owner token names this
        process's socket directory (sockets.py) and model slots (waiting.Slots);
        max_request_size: the daemon's, which bounds its answers too (answer_limit)."""
        self.config = config
        self.max_request_size = max_request_size
        self.arena_size = arena_size    # each loaded version gets an arena of its own (0: none)
        self._retired_counts = {"forwarded": 0, "full": 0}   # of the arenas of unloaded versions
        self.runners_dir, self.tmp_dir = runners_dir, tmp_dir
        self.run_dir = daemon_run_dir(runners_dir, owner_token(tmp_dir))
        self.slots = Slots(slots_dir(runners_dir), tmp_dir)
        self._on_change = on_change
        self._live: set[ModelRunners] = set()
        self._generation = itertools.count(1)
        self.prewarm: PrewarmPool | None = None   # started by start_prewarm(), after prepare()
        self._prewarm_kinds: list[str] = []         # prepare() finds which have their framework here

    def prepare(self) -> None:
        """At daemon start: this daemon's socket directory, without those of
        daemons that are gone (a live one's are left alone)."""
        inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
        for device in self.config.devices:   # a GPU the daemon was not given fails the start, not each load
            if device != "cpu":
                physical_gpu(device, inherited)
        ensure_run_dir(self.runners_dir)
        ensure_run_dir(self.run_dir)
        for path in self.slots.prepare():
            log.info("removed the model slot of a runner of a daemon that is gone: %s", path)
        for path in clean_stale_sockets(self.runners_dir, self.tmp_dir):
            log.info("removed the runner socket of a daemon that is gone: %s", path)
        for path in remove_stale_cgroups(CGROUP_PREFIX):
            log.info("removed the cgroup of a runner of a daemon that is gone: %s", path)
        if self.config.sandbox != "none" and take_delegation():
            log.info("runner cgroups: the delegated cgroup's controllers are the runners' (the daemon moved to a leaf)")
        self._check_sandbox()
        self._prewarm_kinds = self._frameworks_here(self.config.prewarm)

    def _sandbox_policy(self) -> SandboxPolicy | None:
        """[runners]' sandbox, transient uids held in the store's locks/ too (others' containers see it)."""
        return sandbox_policy(self.config, StoreLayout(self.tmp_dir.parent).locks_dir)

    def _check_sandbox(self) -> None:
        """Say at start what runners will run in (probing bubblewrap now,
        once: prepare() runs in a thread, and the probe starts processes)."""
        policy = self._sandbox_policy()
        if policy is None:
            log.warning("runners.sandbox = none: model code runs with the daemon's own rights")
            return
        try:   # what runners read of the store: materialized models, and the slots of those started early
            host = prerequisites(policy, (StoreLayout(self.tmp_dir.parent).models_dir, self.slots.path))
        except InvalidInput as e:
            log.warning("runners cannot be sandboxed here, so loads that run model code will fail: %s", e)
            return
        if host.no_bwrap:
            log.warning("bubblewrap cannot run here, so runners get Landlock alone: %s", host.no_bwrap)
        log.info("runners run sandboxed: %s", host.describe(policy))
        for line in host.unreachable:
            log.warning("loads will fail: %s", line)

    async def begin(self, name: str, version: str, model_dir: Path, cfg: CartonConfig,
                    triton_config: Mapping[str, Any] | None, *, early: bool) -> Starting | None:
        """Plan the runners of one model version and get their processes
        going before model_dir exists: each instance takes a pre-warmed spare
        of its kind and device, or, when ``early``, starts its own runner now
        (waiting.py). None when no runner is configured for it; InvalidInput
        when it cannot run."""
        plan = await asyncio.to_thread(plan_runner, cfg, self.config)
        if plan is None:
            return None
        devices = instance_devices(triton_config, self.config.devices)
        policy = self._sandbox_policy()
        specs = instance_specs(plan, model_dir=model_dir, name=name, version=version,
                               opts=runner_opts(cfg, triton_config), devices=devices, run_dir=self.run_dir,
                               generation=next(self._generation), sandbox=policy)
        starting = Starting(plan, devices, specs)
        if not plan.builtin:   # only the built-in runners wait for their model (model_channel.py)
            return starting
        kind = plan.runner_name
        for i, spec in enumerate(specs):
            spare = self.prewarm.take(kind, spec.device) \
                if self.prewarm is not None and (policy is None or name not in policy.network) else None
            if spare is not None:
                starting.waiting[i] = _done(spare)
                starting.when_closed.append(functools.partial(self.prewarm.settled, kind, spec.device, spare))  # type: ignore[union-attr]  # a spare: a pool
            elif early:
                slotted = with_model_dir(spec, self.slots.new(spec.socket_path.stem))
                starting.waiting[i] = asyncio.ensure_future(
                    start_waiting(slotted, f"{name}#{i}", STDERR_LINES))
        return starting

    async def start(self, name: str, version: str, model_dir: Path, cfg: CartonConfig,
                    triton_config: Mapping[str, Any] | None, starting: Starting | None = None) -> ModelRunners | None:
        """Start and wait for the runners of one model version (those
        ``starting`` began, begin() otherwise); None when no runner is
        configured for it. InvalidInput when it cannot start (the reason
        carries the runner's last stderr lines)."""
        try:
            if starting is None:
                starting = await self.begin(name, version, model_dir, cfg, triton_config, early=False)
                if starting is None:
                    return None
            # An arena of its own: a runner maps its model's tensors and no other's.
            arena = TensorArena(self.arena_size) if self.arena_size else None
            runners = ModelRunners(name, version, starting.specs, self.config, on_change=self._on_change,
                                   arena=arena, first_processes=starting.first_processes(),
                                   answer_limit=answer_limit(cfg.outputs, self.config.max_response_size,
                                                             self.max_request_size))
            self._live.add(runners)
            log.info("model %s version %s: starting %d %s runner(s) on %s%s", name, version[:12],
                     len(starting.specs), starting.plan.runner_name, ", ".join(starting.devices),
                     starting.describe())
            try:
                await runners.start()
            except BaseException:
                self._live.discard(runners)
                self._retire(runners)
                raise
            return runners
        finally:
            if starting is not None:
                await starting.close()

    @staticmethod
    def _frameworks_here(kinds: tuple[str, ...]) -> list[str]:
        """The kinds whose framework is installed (package metadata: a read of
        the disk, so in prepare()'s thread); the others are logged."""
        here = []
        for kind in kinds:
            try:
                probe_framework(kind)
            except InvalidInput as e:
                log.warning("runners.prewarm: not pre-warming %s: %s", kind, e)
                continue
            here.append(kind)
        return here

    def start_prewarm(self) -> None:
        """After prepare(), on the loop: keep the spares of runners.prewarm
        (prewarm.py) of each kind whose framework is installed here."""
        if not self._prewarm_kinds:
            return
        programs = {kind: tuple(program(kind)) for kind in self._prewarm_kinds}
        self.prewarm = PrewarmPool(programs, self.config.devices, self.run_dir, self.slots, self.config,
                                   self._sandbox_policy())
        self.prewarm.start()
        log.info("pre-warming %s runners on %s", ", ".join(self._prewarm_kinds), ", ".join(self.config.devices))

    async def stop(self, runners: ModelRunners | None) -> None:
        if runners is None:
            return
        try:
            await runners.stop()
        finally:
            self._live.discard(runners)
            self._retire(runners)
        log.info("model %s version %s: runners stopped", runners.name, runners.version[:12])

    async def stop_all(self) -> None:
        if self.prewarm is not None:
            await self.prewarm.close()
        await asyncio.gather(*(self.stop(r) for r in list(self._live)), return_exceptions=True)

    def _retire(self, runners: ModelRunners) -> None:
        if runners.arena is not None and not runners.arena.retiring:
            for key in self._retired_counts:
                self._retired_counts[key] += getattr(runners.arena, key)
            runners.arena.retire()

    def arena_stats(self) -> dict[str, int] | None:
        """The arenas of every loaded version together, for /metrics (the
        counters go on counting those of unloaded versions); None without."""
        if not self.arena_size:
            return None
        stats = dict(self._retired_counts, slots=0, bytes=0)
        for runners in tuple(self._live):
            if runners.arena is not None:
                for key, value in runners.arena.stats().items():
                    stats[key] += value
        return stats

    def statuses(self) -> list[dict[str, Any]]:
        # Read by /metrics on a worker thread while the loop adds and drops
        # runners: tuple() copies the set without letting the loop in between.
        return [r.status() for r in tuple(self._live)]


def _done(value: WaitingRunner) -> asyncio.Future[WaitingRunner]:
    future: asyncio.Future[WaitingRunner] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


class Starting:
    """The runners of one load, planned, some perhaps already started and
    waiting for the model (``waiting[i]``, instance i's), until start() hands
    them theirs. close() ends those never handed one."""

    def __init__(self, plan: RunnerPlan, devices: list[str], specs: list[InstanceSpec]) -> None:
        self.plan, self.devices, self.specs = plan, devices, specs
        self.waiting: list[asyncio.Future[WaitingRunner] | None] = [None] * len(specs)
        self.when_closed: list[Callable[[], None]] = []   # told once the load is done (a spare's refill)

    def describe(self) -> str:
        started = sum(1 for w in self.waiting if w is not None)
        return f" ({started} already started)" if started else ""

    def first_processes(self) -> list[FirstProcess | None]:
        return [functools.partial(self._hand, i) if w is not None else None for i, w in enumerate(self.waiting)]

    async def _hand(self, index: int, spec: InstanceSpec, arena_fd: int | None, label: str) -> RunnerProcess | None:
        """Instance ``index``'s started runner, handed its model; None (the
        instance spawns one the usual way) when it could not start or died
        waiting, or the handing failed."""
        waiting, self.waiting[index] = self.waiting[index], None
        if waiting is None:
            return None
        try:
            runner = await waiting
            if not runner.alive:
                await runner.process.wait()
                reason = runner.process.exit_reason()
                await runner.discard()
                raise RunnerFailed(f"it exited while waiting: {reason}")
            return await hand_model(runner, spec, arena_fd, label)
        except RunnerFailed as e:
            log.warning("[%s] the runner started before its model cannot serve it, starting another: %s", label,
                        e.reason)
            return None

    async def close(self) -> None:
        """End every started runner no instance took; tell when_closed."""
        told, self.when_closed = self.when_closed, []
        for tell in told:
            tell()
        left = [w for w in self.waiting if w is not None]
        self.waiting = [None] * len(self.waiting)
        for waiting in left:
            try:
                runner = await waiting
            except BaseException:  # noqa: BLE001 - cancelled or failed: nothing left to end
                continue
            await runner.discard()
