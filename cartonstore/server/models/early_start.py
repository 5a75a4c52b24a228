"""A load's runners, started while its carton's blobs are still coming.

A load by source learns which runner its carton needs as soon as the carton
is in the index (Puller.add's on_committed), before the LINKS blobs are
fetched. From there its runners start (RunnerHost.begin, early: the
interpreter, the framework's import and the GPU context, in parallel with
the download) and wait for their model (server/runner_processes/waiting.py); the
load hands it to them once materialized. What cannot start early starts
the usual way at its turn; what the load never uses is ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cartonstore.store import Store

    from .loaded_model import LoadedModel
    from .runtime import RunnerHost, Starting

log = logging.getLogger("cartonstore.server")


class EarlyStart:
    def __init__(self, store: Store, runner_host: RunnerHost, model: LoadedModel, *,
                 skip: Callable[[str], bool] = lambda digest: False) -> None:
        self._store, self._runner_host = store, runner_host
        self._model = model   # its config is parsed and checked before its source is read
        self._skip = skip     # a version that needs no runners (it serves already, as asked)
        self._task: asyncio.Task[Starting | None] | None = None
        self._digest: str | None = None

    def committed(self, digest: str) -> None:
        """Puller.add's on_committed: start this carton's runners now."""
        if self._task is None and not self._skip(digest):
            self._digest = digest
            self._task = asyncio.ensure_future(self._begin(digest))

    async def _begin(self, digest: str) -> Starting | None:
        model = self._model
        carton = await asyncio.to_thread(self._store.config_of, digest)
        return await self._runner_host.begin(model.name, digest, self._store.layout.model_path(digest), carton,
                                             model.config, early=True)

    async def starting(self, model: LoadedModel) -> Starting | None:
        """What was started for ``model``'s version, if anything."""
        task, self._task = self._task, None
        if task is None:
            return None
        try:
            starting = await task
        except Exception as e:  # noqa: BLE001 - the load's own start says why, if it must fail
            log.info("model %s: runners not started early: %s: %s", model.name, type(e).__name__, e)
            return None
        if starting is not None and model.digest != self._digest:
            await starting.close()
            return None
        return starting

    async def close(self) -> None:
        """End whatever was started and not used."""
        task, self._task = self._task, None
        if task is None:
            return
        try:
            starting = await task
        except BaseException:  # noqa: BLE001 - nothing was started, or it ended itself
            return
        if starting is not None:
            await starting.close()
