"""Runners started before their model's files are all there.

A load need not wait for the interpreter, the framework's import and the
GPU context of its runner: they happen while the carton's blobs stream in
(the model's own runner, started the moment its carton is known), or long
before the load (a pre-warmed spare, prewarm.py). Such a runner is sandboxed
like any other, with one difference: what it may read as its model is an
empty directory of its own, a *slot* under <root>/run/slots, bound
read-only into its sandbox when it starts. When the model directory is
materialized, it is laid out again in the slot by hardlinks (no bytes
copied; what a bind mount sees appears in it), and the runner is told to
go on (runner/model_channel.py), with the model's tensor arena, and, for a
spare, the arguments of the instance it becomes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from cartonstore.runner.model_channel import ChannelError, ModelMessage, send_model
from cartonstore.store.materialize.tree import link_tree, remove_tree
from cartonstore.store.root.owner import owner_is_gone, owner_token

from .process import RunnerFailed, RunnerProcess
from .settings import InstanceSpec
from .sockets import remove_socket

log = logging.getLogger("cartonstore.server.runner_processes")

SLOTS = "slots"   # <root>/run/slots, beside the sockets' directory


def slots_dir(run_dir: Path) -> Path:
    """Where slots live: beside the socket directory, which stays 0700. A
    runner of another user passes through it (0711) to its own slot only."""
    return run_dir.parent / SLOTS


_OWNER = re.compile(r"[0-9a-f]{12}")


@dataclass(frozen=True)
class Slots:
    """The model slots of runners started before their model, in ``path``
    (slots_dir): ``<owner>-<label>-<random>``, where owner is this process's
    token in the store's ``tmp_dir`` (store/root/owner.py: held by a flock, so it
    tells a live daemon from a gone one across PID namespaces, as containers
    sharing a store need)."""

    path: Path
    tmp_dir: Path

    def prepare(self) -> list[Path]:
        """Create the slots' directory; remove the slots of owners that are
        gone (several daemons may share one store: a live one's are left
        alone). Returns those removed. Blocking: run in a thread."""
        self.path.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(self.path, 0o711)
        # <root>/run is the daemon's: a runner of another user must pass through it to its slot
        os.chmod(self.path.parent, os.stat(self.path.parent).st_mode & 0o7777 | 0o111)
        owner_token(self.tmp_dir)   # made here, in the caller's thread: new() only looks it up
        removed = []
        for slot in self.path.iterdir():
            owner = slot.name.split("-", 1)[0]
            if _OWNER.fullmatch(owner) and not owner_is_gone(self.tmp_dir, owner):
                continue
            remove_tree(slot)
            removed.append(slot)
        return removed

    def new(self, label: str) -> Path:
        """A slot's path for a runner labelled ``label``, named for this process."""
        return self.path / f"{owner_token(self.tmp_dir)}-{label[:60]}-{secrets.token_hex(4)}"


def with_model_dir(spec: InstanceSpec, model_dir: Path) -> InstanceSpec:
    """``spec`` reading its model from ``model_dir``: the argument naming
    the old directory names the new one."""
    old = str(spec.model_dir)
    return dataclasses.replace(spec, model_dir=model_dir,
                               argv=[str(model_dir) if a == old else a for a in spec.argv])


@dataclass
class WaitingRunner:
    """A started runner waiting for its model (``spec``: how it was started)."""

    spec: InstanceSpec
    process: RunnerProcess
    channel: socket.socket
    slot: Path
    program: tuple[str, ...] | None = None   # a spare's: its argv names no model, the instance's is sent

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and self.channel.fileno() >= 0

    async def discard(self) -> None:
        """Not wanted: the channel closes (the runner exits 0), the process is
        reaped, its slot and socket are removed."""
        self.channel.close()
        await self.process.terminate(1.0)
        if self.spec.sandbox is not None:
            remove_socket(self.spec.socket_path)


async def start_waiting(spec: InstanceSpec, label: str, stderr_lines: int, *,
                        program: tuple[str, ...] | None = None) -> WaitingRunner:
    """Start a runner in a new slot beside spec.model_dir's place: ``spec``
    names the slot as its model directory (with_model_dir) once made.
    RunnerFailed when it cannot start."""
    assert spec.model_dir is not None
    slot = spec.model_dir
    try:
        await asyncio.to_thread(slot.mkdir, 0o755)
    except OSError as e:
        raise RunnerFailed(f"cannot make the runner's model slot {slot}: {e.strerror or e}") from None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = await RunnerProcess.spawn(label, spec, stderr_lines, model_channel=theirs)
    except BaseException:
        ours.close()
        await asyncio.to_thread(remove_tree, slot)
        raise
    finally:
        theirs.close()
    process.slot = slot
    return WaitingRunner(spec, process, ours, slot, program)


async def hand_model(waiting: WaitingRunner, spec: InstanceSpec, arena_fd: int | None, label: str) -> RunnerProcess:
    """Give the waiting runner the model ``spec`` serves: lay spec.model_dir
    out in its slot, move its socket (a spare's) to spec.socket_path, send
    the word. The process is then the instance's; RunnerFailed (the runner
    discarded) when any step fails."""
    assert spec.model_dir is not None
    process = waiting.process
    try:
        await asyncio.to_thread(link_tree, spec.model_dir, waiting.slot)
        if waiting.spec.sandbox is not None and waiting.spec.socket_path != spec.socket_path:
            os.replace(waiting.spec.socket_path, spec.socket_path)   # bound by us: moving it keeps it bound
        argv = None
        if waiting.program is not None:
            args = with_model_dir(spec, waiting.slot).argv
            argv = args[len(waiting.program):]
        await send_model(waiting.channel, ModelMessage(argv, {"arena": arena_fd} if arena_fd is not None else {}))
    except (OSError, ChannelError) as e:
        await waiting.discard()
        if process.returncode is not None and isinstance(e, OSError) and e.errno in (errno.EPIPE, errno.ECONNRESET):
            raise RunnerFailed(process.exit_reason(), process.stderr_lines()) from None
        raise RunnerFailed(f"cannot hand the model to its started runner: {getattr(e, 'strerror', None) or e}") \
            from None
    except BaseException:
        await asyncio.shield(waiting.discard())
        raise
    finally:
        waiting.channel.close()
    process.label = label
    log.info("[%s] model handed to runner pid %d, started %.2fs before", label, process.pid,
             time.monotonic() - process.started_at)
    return process
