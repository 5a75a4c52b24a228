"""The lease API's requests as plain calls on the service: what the
aiohttp routes (app.py) and the daemon's front (server/http/routes.py) both do
with a decoded JSON body.

    POST   /v1/leases               {"model", "ttl"?, "holder"?} -> the lease
    POST   /v1/leases/{id}/renew    {"ttl"?}                     -> the lease
    DELETE /v1/leases/{id}                                       -> {}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cartonstore.errors import InvalidInput

if TYPE_CHECKING:
    from cartonstore.server.models.service import ModelService


async def take(service: ModelService, body: dict[str, Any]) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput("'model' must be a non-empty string: a manifest hash, a name or a source")
    holder = body.get("holder")
    if holder is not None and not isinstance(holder, str):
        raise InvalidInput("'holder' must be a string")
    granted = await service.take_lease(model, service.ttl(body.get("ttl")), holder)
    return granted.as_json()


async def renew(service: ModelService, lease_id: str, body: dict[str, Any]) -> dict[str, Any]:
    granted = await service.renew_lease(lease_id, service.ttl(body.get("ttl")))
    return granted.as_json()


async def release(service: ModelService, lease_id: str) -> dict[str, Any]:
    await service.release_lease(lease_id)
    return {}
