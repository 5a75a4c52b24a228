"""A check worker: a process of the daemon's that parses, validates and
re-frames big JSON infer requests (server/checks/request_check.py), so that work runs on
another core and the daemon's event loop stays free.

Why a process: the work is a few long calls into C (orjson, numpy) that
hold the GIL: in a thread of the daemon they stall its loop all the same
(~45 ms for a 1M-value tensor) and use one core, however many the host
has. server/checks/pool.py starts these workers and speaks this protocol.

Protocol, over stdin and stdout, one task at a time:
  task:   <u4 meta length> <u8 body length> meta body
          meta: pickle of (inputs, outputs); the body is all JSON
  answer: <u4 meta length> meta [parts]
          meta: pickle of one of
            ("forward", header_length, [part sizes])   the parts follow
            ("as_is",)                                 forward the body as it came
            ("shm",)                                   names shared memory: the daemon checks it
            ("invalid", message, subject)              a 400
            ("error", text)                            a fault: the daemon checks it itself
Both ends are the daemon's own code: pickle carries only what it wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import struct
import sys
from typing import BinaryIO

from cartonstore.errors import InvalidInput
from cartonstore.system.parent_death import die_with

from .request_check import checked_unless_shm

TASK_HEAD = struct.Struct("<IQ")
ANSWER_HEAD = struct.Struct("<I")
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = 1031   # fcntl.F_SETPIPE_SZ, named only from Python 3.10 on Linux builds


def answer(meta: bytes, body: bytearray) -> tuple[tuple, list]:
    """The answer's meta and parts for one task."""
    inputs, outputs = pickle.loads(meta)
    try:
        _req, forward = checked_unless_shm(body, None, inputs, outputs)
    except InvalidInput as e:
        return ("invalid", e.message, e.subject), []
    except Exception as e:  # noqa: BLE001 - a bug, or memory: said, and the worker lives on
        return ("error", f"{type(e).__name__}: {e}"), []
    if forward is None:
        return ("shm",), []
    parts, length = forward
    if len(parts) == 1 and parts[0] is body:
        return ("as_is",), []
    return ("forward", length, [len(p) for p in parts]), parts


def _read_exactly(stream: BinaryIO, size: int) -> bytearray | None:
    out = bytearray(size)
    view, got = memoryview(out), 0
    while got < size:
        n = stream.readinto(view[got:])  # type: ignore[attr-defined]  # stdin's buffer: a BufferedReader
        if not n:
            return None
        got += n
    return out


def serve(tasks: BinaryIO, answers: BinaryIO) -> None:
    """Answer tasks until the daemon closes the pipe."""
    while True:
        head = _read_exactly(tasks, TASK_HEAD.size)
        if head is None:
            return
        meta_size, body_size = TASK_HEAD.unpack(head)
        meta, body = _read_exactly(tasks, meta_size), _read_exactly(tasks, body_size)
        if meta is None or body is None:
            return
        out, parts = answer(bytes(meta), body)
        encoded = pickle.dumps(out)
        answers.write(ANSWER_HEAD.pack(len(encoded)) + encoded)
        for part in parts:
            answers.write(part)
        answers.flush()


def _widen_pipes() -> None:
    """Fewer wakeups per megabyte each way (Linux caps the size at
    /proc/sys/fs/pipe-max-size; elsewhere nothing changes)."""
    for fd in (0, 1):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)


if __name__ == "__main__":
    # Set here, not by a preexec_fn in the daemon (which forces a full fork
    # of it). A daemon gone before this line is not noticed by it: the end of
    # stdin, which its death closes, ends the worker all the same.
    die_with(os.getppid())
    _widen_pipes()
    serve(sys.stdin.buffer, sys.stdout.buffer)
