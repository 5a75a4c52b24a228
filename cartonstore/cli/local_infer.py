"""`cartonstore infer` and `cartonstore selftest` with no daemon serving:
start the model's runner here, run the requests through it (validated like
the daemon does), stop it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np

from cartonstore.carton.selftest import SelfTestReport, infer_via, run_self_tests, self_test_cases
from cartonstore.config.load import Config
from cartonstore.config.pulling import standard_puller
from cartonstore.errors import CartonStoreError
from cartonstore.format.carton_toml import CartonConfig
from cartonstore.server.runner_processes import ModelRunners
from cartonstore.store import Store

T = TypeVar("T")


def infer_locally(store: Store, settings: Config, ref: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    async def one(runners: ModelRunners, cfg: CartonConfig, model_dir: Path) -> dict[str, np.ndarray]:
        return await infer_via(runners, cfg, inputs)
    return asyncio.run(with_local_runner(store, settings, ref, one))


def selftest_locally(store: Store, settings: Config, ref: str, rtol: float | None,
                     atol: float | None) -> SelfTestReport:
    """The carton's self-tests through a runner started here; a tolerance
    not given is runners.selftest_rtol/atol, or their _cuda pair when the
    runner is on a GPU."""
    async def tests(runners: ModelRunners, cfg: CartonConfig, model_dir: Path) -> SelfTestReport:
        cases = await asyncio.to_thread(self_test_cases, cfg, model_dir)
        default_rtol, default_atol = settings.runners.selftest_tolerances(runners.devices)
        return await run_self_tests(cases, lambda inputs: infer_via(runners, cfg, inputs),
                                    rtol=default_rtol if rtol is None else rtol,
                                    atol=default_atol if atol is None else atol)
    return asyncio.run(with_local_runner(store, settings, ref, tests))


async def with_local_runner(store: Store, settings: Config, ref: str,
                            use: Callable[[ModelRunners, CartonConfig, Path], Awaitable[T]]) -> T:
    """``use`` with the model's runner started here, stopped after."""
    from cartonstore.server.models.runtime import RunnerHost, files_only_note

    async with standard_puller(store, settings.fetch_config()) as puller:
        model_dir = await puller.materialize(ref)
    cfg = await asyncio.to_thread(store.config_of, model_dir.name)
    host = RunnerHost(settings.runners, store.layout.root / "run" / "runners", store.layout.tmp_dir,
                      max_request_size=settings.server.max_request_size)
    host.prepare()
    runners = await host.start(f"cli-{os.getpid()}", model_dir.name, model_dir, cfg, None)
    if runners is None:
        raise CartonStoreError(files_only_note(cfg.runner.runner_name), subject=ref)
    try:
        return await use(runners, cfg, model_dir)
    finally:
        await host.stop(runners)
