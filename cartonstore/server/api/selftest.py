"""POST /v2/models/{name}[/versions/{v}]/selftest (body optional:
{"rtol": ..., "atol": ...}): a loaded model's self-tests on request
(server/models/loaded_self_tests.py runs them). A report that fails is still a 200
here; a load turns it into a 400 (SelfTestFailed)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cartonstore.config.values import BadValue, tolerance
from cartonstore.errors import InvalidInput
from cartonstore.server.inference import serving_model
from cartonstore.server.models.loaded_self_tests import self_test

from .context import body_json, svc


def _tolerances(doc: dict[str, Any], defaults: tuple[float, float]) -> tuple[float, float]:
    unknown = sorted(set(doc) - {"rtol", "atol"})
    if unknown:
        raise InvalidInput(f"unknown field(s) in the selftest request: {', '.join(unknown)} (it takes rtol, atol)")
    out = []
    for key, default in zip(("rtol", "atol"), defaults, strict=True):
        try:
            out.append(tolerance(doc[key]) if key in doc else default)
        except BadValue as e:
            raise InvalidInput(f"{key}: {e}", subject=key) from None
    return out[0], out[1]


async def selftest(request: web.Request) -> web.Response:
    service = svc(request)
    name, version = request.match_info["name"], request.match_info.get("version")
    model = serving_model(service, name, version)
    devices = model.runners.devices if model.runners is not None else []
    rtol, atol = _tolerances(await body_json(request), service.runner_host.config.selftest_tolerances(devices))
    report = await self_test(model, service.store.layout.model_path(model.digest), rtol, atol)  # type: ignore[arg-type]  # READY
    return web.json_response({"model_name": name, "model_version": model.digest, **report.as_json()})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v2/models/{name}/selftest", selftest)
    router.add_post("/v2/models/{name}/versions/{version}/selftest", selftest)
