"""Triton's statistics and model configuration extensions:

    GET /v2/models/stats
    GET /v2/models/{name}[/versions/{version}]/stats
    GET /v2/models/{name}[/versions/{version}]/config

Statistics are kept per loaded version by the inference core (each request
counted, with the times its runner reports); the config is made from
carton.toml and the load's config (models/model_config.py). Both are read
in server/inference/models.py, for every door.
"""

from __future__ import annotations

from aiohttp import web

from cartonstore.server.inference import config_of, statistics

from .context import svc


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
