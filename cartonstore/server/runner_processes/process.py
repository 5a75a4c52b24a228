"""One runner OS process: spawn it, wait until it serves, explain how it
ended, stop it.

The runner gets its own session (so its process group holds every helper it
forks and one signal reaches them all) and PR_SET_PDEATHSIG=SIGKILL (so it
dies with the daemon, even when the daemon is SIGKILLed and cannot clean
up). Its stderr is read continuously: logged line by line and the last lines
kept to say why it failed.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from cartonstore.errors import CartonStoreError, InvalidInput
from cartonstore.runner.protocol import ARENA_FD_ENV, MODEL_CHANNEL_ENV, READY_PATH, SHM_CHANNEL_ENV, WARM_DEVICES_ENV
from cartonstore.store.materialize.tree import remove_tree
from cartonstore.system.cgroups import RunnerCgroup
from cartonstore.system.child_stop import stop_child
from cartonstore.system.exit_notice import ExitNoticingProtocol
from cartonstore.system.parent_death import die_with
from cartonstore.system.sockets import bind_unix

from .sandbox import Confinement, confine
from .settings import InstanceSpec
from .wire import BadResponse, RunnerClient

log = logging.getLogger("cartonstore.server.runner_processes")

POLL_INTERVAL = 0.025
MAX_LINE = 4000          # a longer stderr line is cut, so one line cannot hog memory
LOG_BURST = 200          # stderr lines a runner may put in the daemon's log at once...
LOG_RATE = 20.0          # ...and per second after that; the rest are counted, not logged...
UNLOGGED_EVERY = 10.0    # ...and said at most this often
DRAIN_WAIT = 1.0         # after exit, how long to wait for the last stderr bytes

T = TypeVar("T")


async def owned(starting: Awaitable[T], end: Callable[[T], Awaitable[object]]) -> T:
    """What ``starting`` (a process being started) gives. Cancelled while
    it forks, we let it finish and ``end`` what it gave: no process outlives
    the one that asked for it."""
    task = asyncio.ensure_future(starting)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        def ended(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None and done.result() is not None:
                asyncio.ensure_future(end(done.result()))  # noqa: RUF006 - the process's transport holds it
        task.add_done_callback(ended)
        raise


class RunnerFailed(Exception):
    """A runner that did not come up or went away; reason says how, with
    its last stderr lines (also kept apart in ``stderr``)."""

    def __init__(self, reason: str, stderr: list[str] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.stderr = stderr or []


def seconds(value: float) -> str:
    return f"{value:g}s"


def describe_exit(returncode: int) -> str:
    if returncode == -signal.SIGBUS:   # the one way a client can crash a runner it shares memory with
        return (f"exited with signal {-returncode} (SIGBUS: it touched mapped memory past the end of a file, "
                f"such as a shared memory region truncated while the model read it)")
    if returncode < 0:
        try:
            return f"exited with signal {-returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"exited with signal {-returncode}"
    return f"exited with status {returncode}"


def _text(raw: bytes) -> str:
    return raw[:MAX_LINE].decode("utf-8", "replace").rstrip()


def _enter(parent_pid: int, cgroup: RunnerCgroup) -> None:
    """Between fork and exec: die with the daemon, and enter the runner's
    cgroup before anything of its own runs (nothing it forks escapes it)."""
    die_with(parent_pid)
    cgroup.attach_self()


def _sandboxed(spec: InstanceSpec, env: dict[str, str]) -> tuple[socket.socket, Confinement]:
    """In a thread: the socket a sandboxed runner is handed, bound here (it
    may not see the run directory), and its Confinement."""
    assert spec.sandbox is not None and spec.model_dir is not None   # InstanceSpec's own check
    listen = bind_unix(spec.socket_path, mode=0o600, private_dir=True)
    try:
        return listen, confine(spec.sandbox, list(spec.argv), model_dir=spec.model_dir, model=spec.model,
                               device=spec.device, listen_fd=listen.fileno(), env=env,
                               label=spec.socket_path.stem, extra_env=dict(spec.env))
    except BaseException:
        listen.close()
        raise


class RunnerProcess:
    """A spawned runner process. Create with ``await RunnerProcess.spawn(...)``."""

    def __init__(self, label: str, transport: asyncio.SubprocessTransport, protocol: ExitNoticingProtocol,
                 stderr_lines: int) -> None:
        self.label = label
        self.pid: int = transport.get_pid()
        self.started_at = time.monotonic()
        self.kill_reason: str | None = None     # set when the supervisor killed it on purpose
        self._transport = transport
        self._exit_seen = protocol.exit_seen
        self._tail: collections.deque[str] = collections.deque(maxlen=max(stderr_lines, 1))
        self._keep_stderr = stderr_lines > 0
        self._log_allowance = float(LOG_BURST)   # a token bucket: model code decides nothing of the log's size
        self._log_refilled = time.monotonic()
        self._unlogged = 0
        self._said_at = float("-inf")
        self._drains = [asyncio.ensure_future(self._drain(protocol.stderr, keep=True)),
                        asyncio.ensure_future(self._drain(protocol.stdout, keep=False))]
        self._exited = asyncio.ensure_future(self._wait_exit())
        self.confinement: Confinement | None = None
        self.shm_channel: socket.socket | None = None   # a sandboxed runner's end for region fds (shm_link.py)
        self.slot: Path | None = None   # the model directory it was started with, ours to remove (waiting.py)

    @classmethod
    async def spawn(cls, label: str, spec: InstanceSpec, stderr_lines: int,
                    arena_fd: int | None = None, model_channel: socket.socket | None = None) -> RunnerProcess:
        """Start the process (inheriting the tensor arena's fd, when given,
        named by ARENA_FD_ENV: its model's own); raises RunnerFailed when it
        cannot be started. A sandboxed one (spec.sandbox) runs in a
        sandbox.py Confinement, handed its socket, bound here. Given
        ``model_channel`` (its end is inherited), it waits for its model
        (runner/model_channel.py, waiting.py)."""
        env = dict(os.environ)
        env.update(spec.env)
        try:
            env["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
        except InvalidInput as e:
            raise RunnerFailed(str(e)) from None
        env.pop(ARENA_FD_ENV, None)
        pass_fds: tuple[int, ...]
        preexec: Callable[[], object]
        argv, pass_fds, preexec = list(spec.argv), (), functools.partial(die_with, os.getpid())
        confinement = listen = shm_channel = runner_end = None
        try:
            if spec.sandbox is not None:
                # Planning reads the user database, walks directories, makes a cgroup: not on the loop.
                listen, confinement = await asyncio.to_thread(_sandboxed, spec, env)
                argv, env, pass_fds = confinement.argv, confinement.env, (listen.fileno(),)
                # No /dev/shm in the sandbox: regions' fds are handed over this channel (shm_link.py).
                shm_channel, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                env[SHM_CHANNEL_ENV] = str(runner_end.fileno())
                pass_fds += (runner_end.fileno(),)
                if confinement.cgroup is not None:
                    preexec = functools.partial(_enter, os.getpid(), confinement.cgroup)
            if arena_fd is not None:
                env[ARENA_FD_ENV] = str(arena_fd)
                pass_fds += (arena_fd,)
            if model_channel is not None:
                env.update({MODEL_CHANNEL_ENV: str(model_channel.fileno()), WARM_DEVICES_ENV: spec.device})
                pass_fds += (model_channel.fileno(),)
            loop = asyncio.get_running_loop()
            transport, protocol = await loop.subprocess_exec(
                lambda: ExitNoticingProtocol(loop), *argv, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
                preexec_fn=preexec, pass_fds=pass_fds)
        except BaseException as e:
            if shm_channel is not None:
                shm_channel.close()
            if confinement is not None:
                confinement.release()
            if not isinstance(e, (OSError, subprocess.SubprocessError, CartonStoreError)):
                raise
            if spec.sandbox is not None and confinement is None:
                raise RunnerFailed(f"cannot sandbox the runner: {e}") from None
            raise RunnerFailed(f"cannot run {argv[0]!r}: {getattr(e, 'strerror', None) or e}") from None
        finally:
            for sock in (listen, runner_end):   # the runner holds them now
                if sock is not None:
                    sock.close()
        sandboxed = f" in a sandbox ({confinement.description})" if confinement is not None else ""
        log.info("[%s] started pid %d%s: %s", label, transport.get_pid(), sandboxed, " ".join(spec.argv))
        process = cls(label, transport, protocol, stderr_lines)
        process.confinement, process.shm_channel = confinement, shm_channel
        return process

    # -- output -------------------------------------------------------------

    async def _drain(self, stream: asyncio.StreamReader | None, *, keep: bool) -> None:
        """Log its lines, within the log's allowance; keep the last stderr
        ones. Reads until EOF so a chatty runner never blocks on a full pipe.
        Lines past the allowance are counted, not split one by one: a runner
        writing short lines at pipe speed costs the loop a count per read."""
        if stream is None:
            return
        pending = b""
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                break
            pending += chunk
            end = pending.rfind(b"\n")
            if end >= 0:
                self._lines(pending[:end], keep)
                pending = pending[end + 1:]
            if len(pending) > MAX_LINE:
                self._lines(pending, keep)
                pending = b""
        if pending:
            self._lines(pending, keep)
        if self._unlogged:
            self._said_unlogged()

    def _lines(self, block: bytes, keep: bool) -> None:
        """The lines of ``block`` (no newline at its end): as many as the
        allowance lets go to the log, and the last ones to the kept tail."""
        count = block.count(b"\n") + 1
        loggable = self._take_allowance(count)
        kept = self._tail.maxlen if keep and self._keep_stderr else 0
        logged = block.split(b"\n", loggable)[:loggable] if loggable < count else block.split(b"\n")
        for line in logged:
            if text := _text(line):
                log.info("[%s] %s", self.label, text)
        if kept:
            for line in logged[-kept:] if loggable == count else block.rsplit(b"\n", kept)[-kept:]:
                if text := _text(line):
                    self._tail.append(text)

    def _take_allowance(self, count: int) -> int:
        """How many of ``count`` lines the log takes now (a token bucket:
        model code decides nothing of the log's size); the rest are counted,
        and said every UNLOGGED_EVERY seconds."""
        now = time.monotonic()
        self._log_allowance = min(LOG_BURST, self._log_allowance + (now - self._log_refilled) * LOG_RATE)
        self._log_refilled = now
        taken = min(count, int(self._log_allowance))
        self._log_allowance -= taken
        self._unlogged += count - taken
        if self._unlogged and now - self._said_at >= UNLOGGED_EVERY:
            self._said_unlogged()
        return taken

    def _said_unlogged(self) -> None:
        log.warning("[%s] %d output lines not logged: it wrote more than %d at once or %g a second", self.label,
                    self._unlogged, LOG_BURST, LOG_RATE)
        self._unlogged = 0
        self._said_at = time.monotonic()

    def stderr_lines(self) -> list[str]:
        return list(self._tail)

    # -- life ---------------------------------------------------------------

    async def _wait_exit(self) -> int:
        await self._exit_seen
        # The last words usually come just before the exit; helpers that
        # inherited the pipe may hold it open, so do not wait forever.
        await asyncio.wait(self._drains, timeout=DRAIN_WAIT)
        return self._transport.get_returncode()  # type: ignore[return-value]  # the process has exited: it has its status

    @property
    def returncode(self) -> int | None:
        """The exit status once it exited (and was reaped), else None."""
        return self._transport.get_returncode()

    async def exit_seen(self) -> None:
        """Wait for the exit only."""
        await asyncio.shield(self._exit_seen)

    async def wait(self) -> int:
        """Wait for the exit and for its last stderr lines."""
        return await asyncio.shield(self._exited)

    async def exited_within(self, timeout: float) -> bool:
        """Whether it exits within timeout; if so its last stderr lines are
        read (briefly: a helper may hold the pipe) before this returns."""
        await asyncio.wait([self._exited], timeout=timeout)
        return self._exit_seen.done()

    def exit_reason(self) -> str:
        """How it ended, with the last stderr lines: the reason users see."""
        code = self.returncode
        what = self.kill_reason or ("is running" if code is None else describe_exit(code))
        tail = self.stderr_lines()
        return f"{what}; its last stderr lines:\n" + "\n".join(f"  {line}" for line in tail) if tail else what

    async def wait_ready(self, client: RunnerClient, timeout: float) -> None:
        """Poll /v2/health/ready until it answers 200. Raises RunnerFailed
        (after killing the process) when it exits first, timeout passes, or
        it answers what is not an HTTP answer within the wire's limits (a
        model that took over its runner's socket)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._exit_seen.done():
                await self.wait()
                raise RunnerFailed(self.exit_reason(), self.stderr_lines())
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill(f"not ready after {seconds(timeout)}")
                await self.wait()
                raise RunnerFailed(self.exit_reason(), self.stderr_lines())
            try:
                status, _, _ = await asyncio.wait_for(client.request("GET", READY_PATH, {}), min(left, 2.0))
                if status == 200:
                    return
            except BadResponse as e:
                if e.answered:
                    self.kill(f"killed after answering its readiness probe ({READY_PATH}) wrongly: {e}")
                    await self.wait()
                    raise RunnerFailed(self.exit_reason(), self.stderr_lines()) from None
            except (OSError, asyncio.TimeoutError):
                pass  # not listening yet
            await asyncio.wait([self._exit_seen], timeout=min(POLL_INTERVAL, max(left, 0)))

    def signal_group(self, sig: int) -> None:
        """Send sig to the runner's whole process group. After the leader is
        reaped the group lives on while a helper it forked does (and its id
        cannot be reused until then), so this also reaches stragglers."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, reason: str | None = None) -> None:
        """SIGKILL the group now; reason replaces "exited with signal 9"."""
        if reason and self.kill_reason is None and self.returncode is None:
            self.kill_reason = reason
        self.signal_group(signal.SIGKILL)

    async def terminate(self, grace: float) -> None:
        """SIGTERM the group, wait up to grace, then SIGKILL it; reaped and
        its pipes closed on return."""
        await stop_child(self.signal_group, self._exit_seen, grace)
        await self.wait()
        self.close()

    def close(self) -> None:
        """Release the pipes of a process that has exited, and its sandbox's
        cgroup and private tmp."""
        for task in self._drains:
            task.cancel()
        self._transport.close()
        if self.confinement is not None:
            self.confinement.release()
        if self.shm_channel is not None:
            self.shm_channel.close()
        if self.slot is not None:   # a walk of the model's tree: not on the loop
            slot, self.slot = self.slot, None
            try:
                asyncio.get_running_loop().run_in_executor(None, remove_tree, slot)
            except RuntimeError:   # no loop: closed at interpreter exit
                remove_tree(slot)
