"""A loaded model's self-tests, in the daemon: on load (before the model
takes traffic) and on POST /v2/models/{name}[/versions/{v}]/selftest
(body optional: {"rtol": ..., "atol": ...}). A report that fails is still
a 200 here; the load turns it into a 400 (SelfTestFailed)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..config_values import BadValue, tolerance
from ..errors import InvalidInput
from ..selftest import SelfTestReport, infer_via, run_self_tests, self_test_cases
from .infer_api import serving_model

log = logging.getLogger("cartonstore.server")

if TYPE_CHECKING:
    from .loaded_model import LoadedModel
    from .service import ModelService


class SelfTestFailed(InvalidInput):
    """A load whose model failed its own self-tests (400, with the report)."""

    def __init__(self, report: SelfTestReport, subject: str) -> None:
        super().__init__(f"self-test failed, so the model was not made ready: {report.summary()}", subject=subject)
        self.report = report


async def self_test(service: ModelService, model: LoadedModel, rtol: float, atol: float) -> SelfTestReport:
    """``model``'s self-tests through its runners (it need not be READY yet)."""
    assert model.runners is not None and model.carton is not None and model.digest is not None
    path = service.store.layout.model_path(model.digest)
    cases = await asyncio.to_thread(self_test_cases, model.carton, path)
    runners, carton = model.runners, model.carton
    return await run_self_tests(cases, lambda inputs: infer_via(runners, carton, inputs, model.name),
                                rtol=rtol, atol=atol)


async def self_tested_on_load(service: ModelService, model: LoadedModel) -> None:
    """With runners.selftest_on_load, a model whose self-tests fail is
    stopped before it serves: SelfTestFailed carries the report."""
    settings = service.runner_host.config
    if model.runners is None or not settings.selftest_on_load or not model.carton.self_tests:
        return
    try:
        report = await self_test(service, model, settings.selftest_rtol, settings.selftest_atol)
    except BaseException:
        await _stop(service, model)
        raise
    if report.model_failed:
        await _stop(service, model)
        raise SelfTestFailed(report, model.name)
    # A broken test (one that cannot be sent) says nothing of the model: it loads, and the log says so.
    log.log(logging.INFO if report.passed else logging.WARNING, "model %s version %s: %s", model.name,
            model.digest[:12], report.summary())


async def _stop(service: ModelService, model: LoadedModel) -> None:
    runners, model.runners = model.runners, None   # the index gives the load's reason, not "unloaded"
    await service.runner_host.stop(runners)


def _tolerances(doc: dict[str, Any], service: ModelService) -> tuple[float, float]:
    settings = service.runner_host.config
    unknown = sorted(set(doc) - {"rtol", "atol"})
    if unknown:
        raise InvalidInput(f"unknown field(s) in the selftest request: {', '.join(unknown)} (it takes rtol, atol)")
    out = []
    for key, default in (("rtol", settings.selftest_rtol), ("atol", settings.selftest_atol)):
        try:
            out.append(tolerance(doc[key]) if key in doc else default)
        except BadValue as e:
            raise InvalidInput(f"{key}: {e}", subject=key) from None
    return out[0], out[1]


async def selftest(request: web.Request) -> web.Response:
    from .app import body_json, svc

    service = svc(request)
    name, version = request.match_info["name"], request.match_info.get("version")
    model = serving_model(service, name, version)
    rtol, atol = _tolerances(await body_json(request), service)
    report = await self_test(service, model, rtol, atol)
    return web.json_response({"model_name": name, "model_version": model.digest, **report.as_json()})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v2/models/{name}/selftest", selftest)
    router.add_post("/v2/models/{name}/versions/{version}/selftest", selftest)
