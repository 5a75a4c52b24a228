"""The lease API's requests as plain calls on the service: what the
aiohttp routes (app.py) and the daemon's front (front_routes.py) both do
with a decoded JSON body.

    POST   /v1/leases               {"model", "ttl"?, "holder"?} -> the lease
    POST   /v1/leases/{id}/renew    {"ttl"?}                     -> the lease
    DELETE /v1/leases/{id}                                       -> {}
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput
from .bodies import IN_THREAD_FROM

if TYPE_CHECKING:
    from .service import ModelService


def json_object(raw: bytes | bytearray) -> dict[str, Any]:
    """The JSON object in a request body; {} for an empty one."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidInput(f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"request body must be a JSON object, got {type(data).__name__}")
    return data


async def body_object(raw: bytes | bytearray) -> dict[str, Any]:
    """json_object, in a thread for a big body (a load may upload files as
    base64 parameters, up to max_request_size)."""
    return json_object(raw) if len(raw) < IN_THREAD_FROM else await asyncio.to_thread(json_object, raw)


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
