"""One supervised runner instance: its current process, the keep-alive HTTP
client to it, restarts with backoff, and forwarding one request to it."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cartonstore.config.runners import RunnerSettings
from cartonstore.errors import BadUpstream, Unavailable
from cartonstore.runner.protocol import (
    ARENA_EXTENSION,
    DECOUPLED_EXTENSION,
    SERVER_METADATA_PATH,
    TIMING_HEADER,
    parse_timing,
)
from cartonstore.system.backoff import doubling
from cartonstore.system.waiters import within

from .process import RunnerFailed, RunnerProcess, owned, seconds
from .settings import (
    FORWARDED_RESPONSE_HEADERS,
    LOADING,
    READY,
    RESTART_DELAY_MAX,
    STABLE_AFTER,
    STDERR_LINES,
    UNAVAILABLE,
    InstanceSpec,
    NotSent,
    RunnerResponse,
)
from .shm_link import RunnerShmLink
from .sockets import remove_socket
from .stream_wire import StreamBroken, open_stream, read_answer
from .wire import BadResponse, RunnerClient, Unsent

if TYPE_CHECKING:
    from cartonstore.server.tensors.arena import TensorArena
    from cartonstore.server.tensors.arena_wire import ArenaForward
    from cartonstore.server.tensors.shm_regions import Region

log = logging.getLogger("cartonstore.server.runner_processes")

STOPPED = "STOPPED"
_FORWARDED = [(name, name.lower()) for name in FORWARDED_RESPONSE_HEADERS]
_TIMING = TIMING_HEADER.lower()
DEATH_NOTICE = 0.25   # after a broken connection, how long to wait to learn whether the process died
# A request the runner had received when it died: it may have run, so it is not sent again.
DIED_WITH_IT = "died with the request in it (it may have run)"


# The process a first start may be given instead of spawning one (waiting.py):
# (spec, arena fd, log name) -> a runner handed its model, or None.
FirstProcess = Callable[[InstanceSpec, "int | None", str], Awaitable["RunnerProcess | None"]]


class RunnerInstance:
    """Instance ``index`` of a model's runners. ``label`` names it in logs
    and errors: "runner for <model> (instance <i>)"."""

    def __init__(self, model: str, index: int, spec: InstanceSpec, settings: RunnerSettings,
                 on_change: Callable[[], None], arena: TensorArena | None = None,
                 first_process: FirstProcess | None = None) -> None:
        self.index = index
        self._first_process = first_process
        self.spec = spec
        self.settings = settings
        self.label = f"runner for {model} (instance {index})"
        self.state = LOADING
        self.reason = "starting"
        self.restarts = 0
        self.outstanding = 0
        self._log_name = f"{model}#{index}"
        self._on_change = on_change
        self._proc: RunnerProcess | None = None
        self._client: RunnerClient | None = None
        self._shm: RunnerShmLink | None = None   # the regions this process has mapped
        self._arena = arena
        self.arena_capable = False               # this process mapped the arena (its GET /v2 says so)
        self.decoupled = False                   # its model streams responses (its GET /v2 says so)
        self._ready_since = 0.0
        self._failures = 0
        self._supervisor: asyncio.Task[None] | None = None

    # -- status -------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    def _set(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason
        self._on_change()

    def status(self) -> dict[str, Any]:
        return {"index": self.index, "device": self.spec.device, "socket": str(self.spec.socket_path),
                "pid": self.pid, "state": self.state, "reason": self.reason, "restarts": self.restarts,
                "outstanding": self.outstanding, "sandbox": self.sandbox}

    @property
    def sandbox(self) -> str:
        """The layers its sandbox holds ("bwrap+landlock+uid+cgroup:pids"), "none" unsandboxed."""
        confinement = self._proc.confinement if self._proc is not None else None
        return confinement.description if confinement is not None else \
            ("none" if self.spec.sandbox is None else "starting")

    @property
    def memory_cgroup(self) -> Path | None:
        """The cgroup directory that accounts its memory and holds its
        memory limit (v2, or v1's memory hierarchy); None without one."""
        confinement = self._proc.confinement if self._proc is not None else None
        cgroup = confinement.cgroup if confinement is not None else None
        return cgroup.memory_dir if cgroup is not None else None

    # -- life ---------------------------------------------------------------

    async def _launch(self, first: bool = False) -> None:
        """Spawn a process (on the first start, take the one already started
        for it, when there is one) and wait until it is ready; RunnerFailed if not."""
        self.arena_capable = False
        arena_fd = self._arena.fd if self._arena is not None else None
        proc = None
        if first and self._first_process is not None:
            proc = await owned(self._first_process(self.spec, arena_fd, self._log_name), _stop_now)  # type: ignore[arg-type]  # None: nothing to stop
        if proc is None:
            remove_socket(self.spec.socket_path)   # left by the previous process; the new one binds afresh
            proc = await owned(RunnerProcess.spawn(self._log_name, self.spec, STDERR_LINES, arena_fd),
                               _stop_now)
        self._proc = proc
        self._client = RunnerClient(str(self.spec.socket_path))
        self._shm = RunnerShmLink(self._client, self.label, self._proc.shm_channel)
        await self._proc.wait_ready(self._client, self.settings.ready_timeout)
        extensions = await _extensions(self._client)
        self.arena_capable = self._arena is not None and ARENA_EXTENSION in extensions
        self.decoupled = DECOUPLED_EXTENSION in extensions
        self._ready_since = time.monotonic()
        log.info("[%s] ready (pid %d) after %.2fs", self._log_name, self._proc.pid,
                 self._ready_since - self._proc.started_at)

    async def start(self) -> None:
        """First start: no restarts; RunnerFailed if it does not come up."""
        await self._launch(first=True)
        self._set(READY, "")
        self._supervisor = asyncio.ensure_future(self._supervise())

    async def _drop_process(self) -> None:
        """Forget a dead process: kill helpers it left in its group, fail
        requests still waiting on it (closing the connections aborts them)."""
        if self._proc is not None:
            proc, self._proc = self._proc, None
            proc.signal_group(signal.SIGKILL)
            proc.close()
        if self._client is not None:
            client, self._client = self._client, None
            client.close()
        self._shm = None

    async def _supervise(self) -> None:
        """Watch the process; when it ends, restart it with doubling backoff.
        max_restarts consecutive failures and the instance stays UNAVAILABLE;
        a process that stayed ready for STABLE_AFTER seconds clears the count."""
        while True:
            assert self._proc is not None
            await self._proc.exit_seen()
            # No new requests while its last stderr lines are read.
            self.state, self.reason = LOADING, self._proc.exit_reason()
            await self._proc.wait()
            reason = self._proc.exit_reason()
            if time.monotonic() - self._ready_since >= STABLE_AFTER:
                self._failures = 0
            log.warning("%s died: %s", self.label, reason)
            while True:
                await self._drop_process()
                self._failures += 1
                if self._failures > self.settings.max_restarts:
                    log.error("%s gave up after %d restarts: %s", self.label, self.settings.max_restarts, reason)
                    remove_socket(self.spec.socket_path)
                    self._set(UNAVAILABLE, f"failed {self._failures} times in a row; last: {reason}")
                    return
                self._set(LOADING, f"restarting after: {reason}")
                delay = doubling(self.settings.restart_backoff, RESTART_DELAY_MAX, self._failures - 1)
                await asyncio.sleep(delay)
                self.restarts += 1
                try:
                    await self._launch()
                except RunnerFailed as e:
                    reason = e.reason
                    log.warning("%s restart failed: %s", self.label, reason)
                    continue
                break
            self._set(READY, "")

    async def stop(self, grace: float) -> None:
        """Stop supervising, SIGTERM the process (SIGKILL after grace), reap it,
        remove its socket. Requests still in flight fail."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
            self._supervisor = None
        if self._proc is not None:
            await self._proc.terminate(grace)
        await self._drop_process()
        remove_socket(self.spec.socket_path)
        self._set(STOPPED, "unloaded")

    # -- requests -----------------------------------------------------------

    async def post(self, path: str, body: Sequence[bytes | memoryview], headers: Mapping[str, str],
                   regions: Sequence[Region] = (), arena: ArenaForward | None = None, *,
                   limit: int) -> RunnerResponse:
        """POST to this instance, once it has mapped the shared memory
        ``regions`` the request names; in the arena's form when ``arena``
        is given and this process maps it; an answer over ``limit`` bytes is
        refused. Failures become Unavailable naming the runner: it died, it
        did not answer in time (then it is killed; the supervisor restarts
        it), or it broke the HTTP exchange (BadUpstream when it answered
        wrongly: over its limit, not HTTP)."""
        proc, client, shm = self._proc, self._client, self._shm
        if proc is None or client is None or client.closed:
            raise NotSent(f"{self.label} is not running: {self.reason or 'restarting'}")
        via_arena = arena is not None and self.arena_capable and arena.slot.arena is self._arena
        if via_arena:
            body, headers = arena.runner_request()  # type: ignore[union-attr]  # via_arena: arena is set
        try:
            status, headers_in, answer = await self._exchange(proc, client, shm, path, body, headers, regions, limit)
        except NotSent:
            raise   # the runner never saw it: the slot is not its to write
        except BaseException:
            if via_arena:   # it may still write outputs into the slot: kept until the process is gone
                arena.slot.hold_until(proc.wait())  # type: ignore[union-attr]  # via_arena: arena is set
            raise
        return RunnerResponse(status, {name: headers_in[key] for name, key in _FORWARDED if key in headers_in}, answer,
                              via_arena, parse_timing(headers_in.get(_TIMING)))

    async def stream(self, path: str, body: Sequence[bytes | memoryview], headers: Mapping[str, str],
                     regions: Sequence[Region] = (), *, limit: int) -> AsyncGenerator[RunnerResponse, None]:
        """POST a decoupled model's request to this instance and yield each
        response it streams (stream_wire.py), each read when the caller asks
        for it. Failures as post's; a runner silent for request_timeout
        between two responses is killed."""
        proc, client, shm = self._proc, self._client, self._shm
        if proc is None or client is None or client.closed:
            raise Unavailable(f"{self.label} is not running: {self.reason or 'restarting'}")
        timeout = self.settings.request_timeout
        self.outstanding += 1
        writer = None
        try:
            if regions:
                await shm.ensure(regions)   # type: ignore[union-attr]  # set with the client
            reader, writer = await open_stream(str(self.spec.socket_path), path, headers, body)
            async for response in read_answer(reader, limit, timeout):
                yield response
        except asyncio.TimeoutError:
            if proc.returncode is None:
                proc.kill(f"killed after sending nothing of a stream for {seconds(timeout)}")
            raise Unavailable(f"{self.label} sent nothing of its stream within {seconds(timeout)}; restarting "
                              "it") from None
        except StreamBroken as e:
            if await proc.exited_within(DEATH_NOTICE):
                raise Unavailable(f"{self.label} died: {proc.exit_reason()}",
                                  details={"stderr": proc.stderr_lines()}) from None
            raise BadUpstream(f"{self.label} broke its stream, so it was cut and its connection closed: "
                              f"{e}") from None
        except (OSError, BadResponse) as e:
            raise Unavailable(f"{self.label} broke the stream's exchange: {type(e).__name__}: {e}") from None
        finally:
            self.outstanding -= 1
            if writer is not None:
                writer.close()

    async def _exchange(self, proc: RunnerProcess, client: RunnerClient, shm: RunnerShmLink | None, path: str,
                        body: Sequence[bytes | memoryview], headers: Mapping[str, str],
                        regions: Sequence[Region], limit: int) -> tuple[int, dict[str, str], bytes | bytearray]:
        timeout = self.settings.request_timeout
        self.outstanding += 1
        try:
            async def exchange() -> tuple[int, dict[str, str], bytes | bytearray]:
                if regions:
                    try:
                        await shm.ensure(regions)   # type: ignore[union-attr]  # set with the client
                    except (BadResponse, OSError, Unavailable) as e:
                        if proc.returncode is None and not await proc.exited_within(DEATH_NOTICE):
                            raise
                        raise Unsent(f"the runner died while mapping the request's shared memory: {e}") from None
                return await client.request("POST", path, headers, body, limit=limit)
            status, headers_in, answer = await within(exchange(), timeout)
        except asyncio.TimeoutError:
            if proc.returncode is None:
                proc.kill(f"killed after not answering a request within {seconds(timeout)}")
                raise Unavailable(f"{self.label} did not answer within {seconds(timeout)}; restarting it") from None
            raise Unavailable(f"{self.label} {DIED_WITH_IT}: {proc.exit_reason()}",
                              details={"stderr": proc.stderr_lines()}) from None
        except Unsent as e:
            raise NotSent(f"{self.label} did not get the request: {e}") from None
        except (BadResponse, OSError) as e:
            # A dead runner closes the connection first; its exit status follows.
            if await proc.exited_within(DEATH_NOTICE):
                raise Unavailable(f"{self.label} {DIED_WITH_IT}: {proc.exit_reason()}",
                                  details={"stderr": proc.stderr_lines()}) from None
            if isinstance(e, BadResponse) and e.answered:
                raise BadUpstream(f"{self.label} answered wrongly, so its answer was dropped and its connection "
                                  f"closed: {e}") from None
            detail = str(e) if isinstance(e, BadResponse) else f"{type(e).__name__}: {e.strerror or e}"
            raise Unavailable(f"{self.label} broke the HTTP exchange: {detail}") from None
        finally:
            self.outstanding -= 1
        return status, headers_in, answer


def _stop_now(process: RunnerProcess) -> Awaitable[None]:
    return process.terminate(0.0)


async def _extensions(client: RunnerClient) -> frozenset[str]:
    """The extensions the runner's GET /v2 lists (none from one that does
    not answer it as a v2 server)."""
    try:
        status, _, body = await asyncio.wait_for(client.request("GET", SERVER_METADATA_PATH, {}), 5.0)
        extensions = json.loads(bytes(body)).get("extensions") if status == 200 else None
    except (OSError, BadResponse, asyncio.TimeoutError, ValueError, AttributeError):
        return frozenset()
    return frozenset(e for e in extensions if type(e) is str) if type(extensions) is list else frozenset()
