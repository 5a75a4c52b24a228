"""The lease API's requests as plain calls on the service: what the
aiohttp routes (app.py) and the daemon's front (server/http/routes.py) both do
with a decoded JSON body.

    POST   /v1/leases               {"model", "ttl"?, "holder"?} -> the lease
    POST   /v1/leases               {"model", "volume", "holder"?} -> a mounted volume's lease (no expiry)
    POST   /v1/leases/{id}/renew    {"ttl"?}                     -> the lease
    DELETE /v1/leases/{id}                                       -> {}
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cartonstore.errors import InvalidInput
from cartonstore.fetch.puller import is_local_source
from cartonstore.server.models.caller_paths import source_caller
from cartonstore.store.metadata.names import HEX, is_valid_name, volume_lease_id

if TYPE_CHECKING:
    from cartonstore.server.models.service import ModelService
    from cartonstore.server.tensors.shm_regions import Peer


async def take(service: ModelService, body: dict[str, Any], peer: Peer) -> dict[str, Any]:
    """``peer``: who asks; a path it names is read with its rights (models/caller_paths.py)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput("'model' must be a non-empty string: a manifest hash, a name or a source")
    holder = body.get("holder")
    if holder is not None and not isinstance(holder, str):
        raise InvalidInput("'holder' must be a string")
    lease_id = None
    if "volume" in body:   # taken again by the same volume: the same lease, kept
        if "ttl" in body:
            raise InvalidInput("a volume's lease has no 'ttl': it lasts until released")
        lease_id, ttl = volume_lease_id(body["volume"]), math.inf
    else:
        ttl = service.ttl(body.get("ttl"))
    if names_a_path(model):   # added as the caller first; leasing never reads a path itself
        caller = source_caller(model, peer, allow_tcp=service.allow_tcp_local_sources)
        model = await service.added_as(model, caller)
    granted = await service.take_lease(model, ttl, holder, lease_id)
    return granted.as_json()


def names_a_path(model: str) -> bool:
    """Whether a lease's model is a path on the daemon's host: not a name,
    a manifest hash or prefix, a URL or a registry reference. A name is
    never looked up as a file in the daemon's working directory."""
    model = model.strip()
    return is_local_source(model) and not is_valid_name(model) and not HEX.fullmatch(model)


async def renew(service: ModelService, lease_id: str, body: dict[str, Any]) -> dict[str, Any]:
    granted = await service.renew_lease(lease_id, service.ttl(body.get("ttl")))
    return granted.as_json()


async def release(service: ModelService, lease_id: str) -> dict[str, Any]:
    await service.release_lease(lease_id)
    return {}
