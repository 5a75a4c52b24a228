"""Loaded models survive a restart. Every load that makes a model READY
records it (name, version, the load's config) in the index under this
daemon's identity (server.id, by default its socket path: daemon.py holds
it, one live daemon per identity), every unload forgets it; a daemon
starting with that identity, in this container or another, loads each
again in the background (server.restore_loaded, --no-restore), live at
once and ready once every one has been tried. A model that fails to load
again is UNAVAILABLE with the reason, like any failed load: the daemon
goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from cartonstore.errors import CartonStoreError, NotFound
from cartonstore.store.metadata import loaded_rows

from .loaded_model import LoadedModel

log = logging.getLogger("cartonstore.server")


class ModelService(Protocol):
    """What of the model service this uses (service.py imports this module)."""

    daemon_id: str | None
    ready: bool
    asked: set[str]

    async def _batch(self, op: Callable[[Any], Any]) -> Any: ...

    def load(self, name: str, params: dict[str, Any], *, version: str | None = None,
             restoring: bool = False) -> Awaitable[LoadedModel | None]: ...


async def remember_loaded(service: ModelService, model: LoadedModel | None) -> None:
    daemon = service.daemon_id
    if daemon is None or model is None or model.digest is None:
        return
    config = json.dumps(model.config, sort_keys=True) if model.config is not None else None
    digest = model.digest
    await service._batch(  # noqa: SLF001 - a part of the model service, split out for its size
        lambda conn: loaded_rows.remember_loaded(conn, daemon, model.name, digest, config))


async def forget_loaded(service: ModelService, name: str) -> None:
    daemon = service.daemon_id
    if daemon is not None:
        await service._batch(  # noqa: SLF001 - a part of the model service, split out for its size
            lambda conn: loaded_rows.forget_loaded(conn, daemon, name))


async def restore_loaded(service: ModelService) -> None:
    """Load again, all at once, what this daemon had loaded. The caller
    sets ``service.ready`` false before any listener opens; it is true
    again once each load has succeeded or failed (not when the restore is
    cancelled: the daemon is stopping). A name a caller loads or unloads
    meanwhile is theirs."""
    cancelled = False
    try:
        daemon = service.daemon_id
        if daemon is None:
            return
        rows = await service._batch(  # noqa: SLF001 - a part of the model service, split out for its size
            lambda conn: loaded_rows.loaded_by(conn, daemon))
        if not rows:
            return
        started = time.monotonic()
        log.info("restoring %d loaded model(s): %s", len(rows), ", ".join(row.name for row in rows))
        results = await asyncio.gather(*(_restore_one(service, row) for row in rows))
        log.info("restored %d of %d loaded model(s) in %.2fs", sum(results), len(rows), time.monotonic() - started)
    except asyncio.CancelledError:
        cancelled = True
        raise
    finally:
        service.asked.clear()   # what callers asked during the restore mattered during it only
        if not cancelled:
            service.ready = True


async def _restore_one(service: ModelService, row: loaded_rows.LoadedRow) -> bool:
    params = {"config": row.config} if row.config is not None else {}
    try:
        return await service.load(row.name, params, version=row.carton, restoring=True) is not None
    except NotFound as e:   # its carton is gone from the store: it will not come back, so it is forgotten
        log.warning("could not restore model %s (version %s): %s; forgetting it", row.name, row.carton[:12], e)
        await forget_loaded(service, row.name)
    except CartonStoreError as e:   # UNAVAILABLE with the reason, as any failed load; tried again next start
        log.warning("could not restore model %s (version %s): %s", row.name, row.carton[:12], e)
    except Exception:  # a bug: logged, and the other restores go on
        log.exception("could not restore model %s (version %s)", row.name, row.carton[:12])
    return False
