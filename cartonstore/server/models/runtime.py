"""Runner processes of the daemon's loaded models: start them for a load,
stop them on unload or after a version switch.

The daemon's config (RunnerSettings of config/runners.py) becomes the
supervisor's settings here; runner_plan.py decides what to run.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from cartonstore.config.runners import RunnerSettings as RunnerConfig
from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import CartonConfig
from cartonstore.server.runners import ModelRunners, RunnerSettings, clean_stale_sockets, ensure_run_dir
from cartonstore.server.runners.sandbox import CGROUP_PREFIX, prerequisites
from cartonstore.server.runners.settings import physical_gpu
from cartonstore.server.tensors.arena import TensorArena
from cartonstore.system.cgroups import remove_stale as remove_stale_cgroups
from cartonstore.system.cgroups import take_delegation

from .runner_plan import instance_devices, instance_specs, plan_runner, runner_opts, sandbox_policy

log = logging.getLogger("cartonstore.server")


def files_only_note(runner_name: str) -> str:
    return (f"loaded as files only: no runner is configured for runner_name {runner_name!r} "
            f"(add a [runners.{runner_name}] table to run it)")


class RunnerHost:
    """Starts and stops the runners of loaded models. One per daemon."""

    def __init__(self, config: RunnerConfig, run_dir: Path, *, on_change: Callable[[], None] | None = None,
                 arena_size: int = 0) -> None:
        self.config = config
        self.arena_size = arena_size    # each loaded version gets an arena of its own (0: none)
        self._retired_counts = {"forwarded": 0, "full": 0}   # of the arenas of unloaded versions
        self.run_dir = run_dir
        self.settings = RunnerSettings(
            ready_timeout=config.ready_timeout, request_timeout=config.request_timeout,
            stop_grace=config.stop_grace, max_restarts=config.max_restarts,
            restart_backoff=config.restart_backoff, max_inflight=config.max_inflight)
        self._on_change = on_change
        self._live: set[ModelRunners] = set()
        self._generation = itertools.count(1)

    def prepare(self) -> None:
        """At daemon start: the socket directory, without sockets of runners
        that died with an earlier daemon."""
        inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
        for device in self.config.devices:   # a GPU the daemon was not given fails the start, not each load
            if device != "cpu":
                physical_gpu(device, inherited)
        ensure_run_dir(self.run_dir)
        for path in clean_stale_sockets(self.run_dir):
            log.info("removed stale runner socket %s", path)
        for path in remove_stale_cgroups(CGROUP_PREFIX):
            log.info("removed the cgroup of a runner of a daemon that is gone: %s", path)
        if self.config.sandbox != "none" and take_delegation():
            log.info("runner cgroups: the delegated cgroup's controllers are the runners' (the daemon moved to a leaf)")
        self._check_sandbox()

    def _check_sandbox(self) -> None:
        """Say at start what runners will run in (probing bubblewrap now,
        once: prepare() runs in a thread, and the probe starts processes)."""
        policy = sandbox_policy(self.config)
        if policy is None:
            log.warning("runners.sandbox = none: model code runs with the daemon's own rights")
            return
        try:
            host = prerequisites(policy)
        except InvalidInput as e:
            log.warning("runners cannot be sandboxed here, so loads that run model code will fail: %s", e)
            return
        log.info("runners run sandboxed: %s", host.describe(policy))

    async def start(self, name: str, version: str, model_dir: Path, cfg: CartonConfig,
                    triton_config: Mapping[str, Any] | None) -> ModelRunners | None:
        """Start and wait for the runners of one model version; None when no
        runner is configured for it. InvalidInput when it cannot start (the
        reason carries the runner's last stderr lines)."""
        plan = await asyncio.to_thread(plan_runner, cfg, self.config)
        if plan is None:
            return None
        devices = instance_devices(triton_config, self.config.devices)
        specs = instance_specs(plan, model_dir=model_dir, name=name, version=version,
                               opts=runner_opts(cfg, triton_config), devices=devices, run_dir=self.run_dir,
                               generation=next(self._generation), sandbox=sandbox_policy(self.config))
        # An arena of its own: a runner maps its model's tensors and no other's.
        arena = TensorArena(self.arena_size) if self.arena_size else None
        runners = ModelRunners(name, version, specs, self.settings, on_change=self._on_change, arena=arena)
        self._live.add(runners)
        log.info("model %s version %s: starting %d %s runner(s) on %s", name, version[:12], len(specs),
                 plan.runner_name, ", ".join(devices))
        try:
            await runners.start()
        except BaseException:
            self._live.discard(runners)
            self._retire(runners)
            raise
        return runners

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
