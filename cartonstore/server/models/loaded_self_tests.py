"""A loaded model's self-tests, in the daemon: run through its runners on
load, before the model takes traffic (runners.selftest_on_load), and on
request (the POST .../selftest route, server/api/selftest.py). A report that
fails stops the load: SelfTestFailed (400) carries it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from cartonstore.carton.selftest import SelfTestReport, infer_via, run_self_tests, self_test_cases
from cartonstore.errors import InvalidInput

from .loaded_model import LoadedModel
from .runtime import RunnerHost

log = logging.getLogger("cartonstore.server")


class SelfTestFailed(InvalidInput):
    """A load whose model failed its own self-tests (400, with the report)."""

    def __init__(self, report: SelfTestReport, subject: str) -> None:
        super().__init__(f"self-test failed, so the model was not made ready: {report.summary()}", subject=subject)
        self.report = report


async def self_test(model: LoadedModel, model_dir: Path, rtol: float, atol: float) -> SelfTestReport:
    """``model``'s self-tests through its runners (it need not be READY yet);
    ``model_dir`` is its carton's model directory."""
    assert model.runners is not None and model.carton is not None and model.digest is not None
    cases = await asyncio.to_thread(self_test_cases, model.carton, model_dir)
    runners, carton = model.runners, model.carton
    return await run_self_tests(cases, lambda inputs: infer_via(runners, carton, inputs, model.name),
                                rtol=rtol, atol=atol)


async def self_tested_on_load(runner_host: RunnerHost, model: LoadedModel, model_dir: Path) -> None:
    """With runners.selftest_on_load, a model whose self-tests fail is
    stopped before it serves: SelfTestFailed carries the report."""
    settings = runner_host.config
    if model.runners is None or not settings.selftest_on_load or not model.carton.self_tests:  # type: ignore[union-attr]  # runners: loaded
        return
    try:
        report = await self_test(model, model_dir, *settings.selftest_tolerances(model.runners.devices))
    except BaseException:
        await _stop(runner_host, model)
        raise
    if report.model_failed:
        await _stop(runner_host, model)
        raise SelfTestFailed(report, model.name)
    # A broken test (one that cannot be sent) says nothing of the model: it loads, and the log says so.
    log.log(logging.INFO if report.passed else logging.WARNING, "model %s version %s: %s", model.name,
            model.digest[:12], report.summary())  # type: ignore[index]  # loaded: it has its digest


async def _stop(runner_host: RunnerHost, model: LoadedModel) -> None:
    runners, model.runners = model.runners, None   # the index gives the load's reason, not "unloaded"
    await runner_host.stop(runners)
