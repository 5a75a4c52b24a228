"""The shared-memory regions one runner process has mapped.

A runner is a v2 server of its own, so the daemon registers a client's
region with it through the same extension (POST
/v2/systemsharedmemory/region/{name}/register), under the daemon's name
for it (Region.runner_name): two uids' regions may share a client name,
never a runner name. Regions are registered on a runner the first time a
request there uses them, and unregistered when the client unregisters
them. A restarted runner gets a new link, with nothing registered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cartonstore.errors import InvalidInput, Unavailable
from cartonstore.runner.protocol import (
    SHM_COPY_INPUTS,
    SHM_FD_PASSED,
    SHM_OBJECT,
    shm_register_path,
    shm_unregister_path,
)
from cartonstore.v2.error_body import error_text

if TYPE_CHECKING:
    from cartonstore.server.tensors.shm_regions import Region

    from .wire import RunnerClient

log = logging.getLogger("cartonstore.server.runner_processes")
_JSON = {"Content-Type": "application/json"}


class RunnerShmLink:
    def __init__(self, client: RunnerClient, label: str, channel: socket.socket | None = None) -> None:
        self._client = client
        self._channel = channel   # a sandboxed runner's: regions go to it as fds, not names
        self._label = label
        self._registered: dict[str, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()   # unregisters under way (the loop keeps only weak refs)

    async def ensure(self, regions: Iterable[Region]) -> None:
        """Every region in ``regions`` registered on the runner (concurrent
        requests wait for one registration); InvalidInput when the runner
        cannot map one or does not speak the extension."""
        for region in regions:
            done = self._registered.get(region.runner_name)
            if done is not None:
                await asyncio.shield(done)
                continue
            done = asyncio.get_running_loop().create_future()
            self._registered[region.runner_name] = done
            region.links.add(self)   # now: an unregister while this registers must reach this runner
            try:
                await self._register(region)
            except BaseException as e:
                self._registered.pop(region.runner_name, None)
                region.links.discard(self)
                # Waiters get an error of their own, never this task's cancellation.
                failed = e if isinstance(e, Exception) else Unavailable(
                    f"mapping shared memory region {region.name!r} in {self._label} was interrupted")
                done.set_exception(failed)
                done.exception()   # retrieved, whether or not anyone waits
                raise
            if region.gone:   # unregistered while the runner mapped it: the unmap may have gone first
                self._registered.pop(region.runner_name, None)
                self._unregister_soon(region.runner_name)
                gone = InvalidInput(f"shared memory region {region.name!r} was unregistered", subject=region.name)
                done.set_exception(gone)   # requests waiting on this registration fail alike
                done.exception()
                raise gone
            done.set_result(None)

    async def _register(self, region: Region) -> None:
        # Triton's three fields, and two of cartonstore's own that other v2 servers ignore.
        doc = {"key": region.key, "offset": region.offset, "byte_size": region.byte_size,
               SHM_OBJECT: list(region.object_id), SHM_COPY_INPUTS: region.foreign}
        if self._channel is not None:   # a sandboxed runner sees no /dev/shm: it gets the daemon's fd
            try:
                socket.send_fds(self._channel, [region.runner_name.encode()], [region.fd])
            except OSError as e:
                raise Unavailable(f"cannot hand shared memory region {region.name!r} to {self._label}: "
                                  f"{e.strerror or e}", subject=region.name) from None
            doc[SHM_FD_PASSED] = True
        body = json.dumps(doc).encode()
        status, _, answer = await self._client.request(
            "POST", shm_register_path(region.runner_name), _JSON, [body])
        if status == 404:
            raise InvalidInput(f"{self._label} does not support Triton's system shared memory extension, so "
                               f"region {region.name!r} cannot be used with this model", subject=region.name)
        if status != 200:
            raise InvalidInput(f"{self._label} could not map shared memory region {region.name!r}: "
                               f"{error_text(answer)}", subject=region.name)

    def forget(self, region: Region) -> None:
        """The client unregistered ``region``: the runner unmaps it too (in
        the background; a runner that died has nothing left to unmap)."""
        if self._registered.pop(region.runner_name, None) is None:
            return
        self._unregister_soon(region.runner_name)

    def _unregister_soon(self, runner_name: str) -> None:
        if self._client.closed:
            return
        task = asyncio.get_running_loop().create_task(self._unregister(runner_name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unregister(self, runner_name: str) -> None:
        try:
            await self._client.request("POST", shm_unregister_path(runner_name), _JSON)
        except Exception as e:  # noqa: BLE001 - a runner that went away has unmapped everything
            log.debug("%s: unregister of %s failed: %s", self._label, runner_name, e)
