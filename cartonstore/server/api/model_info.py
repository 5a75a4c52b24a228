"""Triton's statistics and model configuration extensions:

    GET /v2/models/stats
    GET /v2/models/{name}[/versions/{version}]/stats
    GET /v2/models/{name}[/versions/{version}]/config

Statistics are kept per loaded version by the daemon (api/infer.py counts
each request, with the times its runner reports); the config is made from
carton.toml and the load's config (models/model_config.py).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from cartonstore.errors import NotFound
from cartonstore.server.models.loaded_model import LoadedModel, triton_unknown_model
from cartonstore.server.models.model_config import model_config
from cartonstore.server.models.service import ModelService
from cartonstore.v2.statistics import InferStatistics, statistics_answer

from .context import svc
from .infer import ready_model

_NO_REQUESTS = InferStatistics()   # what a model loaded as files only has done


def model_stats(model: LoadedModel) -> dict[str, Any]:
    stats = model.runners.statistics if model.runners is not None else _NO_REQUESTS
    return stats.model_stats(model.name, model.digest or "")


def statistics(service: ModelService, name: str | None, version: str | None) -> dict[str, Any]:
    """Every loaded version's statistics (``name`` None), or one model's."""
    if name is None:
        loaded = [m for _, m in sorted(service.models.items()) if m.digest is not None and m.state == "READY"]
        return statistics_answer([model_stats(m) for m in loaded])
    model = service.models.get(name)
    if model is None or model.digest is None or model.state != "READY":
        raise NotFound(f"{triton_unknown_model(name)}: it is not loaded", subject=name)
    if version is not None and version != model.digest:
        raise NotFound(f"{triton_unknown_model(name, version)}: the loaded version is {model.digest}",
                       subject=version)
    return statistics_answer([model_stats(model)])


def config_of(service: ModelService, name: str, version: str | None) -> dict[str, Any]:
    model = ready_model(service, name, version)
    devices = model.runners.devices if model.runners is not None else []
    return model_config(name, model.carton, model.config, devices)  # type: ignore[arg-type]  # READY: it has its carton


async def stats_route(request: web.Request) -> web.Response:
    doc = statistics(svc(request), request.match_info.get("name"), request.match_info.get("version"))
    return web.json_response(doc)


async def config_route(request: web.Request) -> web.Response:
    return web.json_response(config_of(svc(request), request.match_info["name"], request.match_info.get("version")))


def add_routes(router: web.UrlDispatcher) -> None:
    """Before the model metadata routes: /v2/models/stats is not a model."""
    router.add_get("/v2/models/stats", stats_route)
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        router.add_get(prefix + "/stats", stats_route)
        router.add_get(prefix + "/config", config_route)
