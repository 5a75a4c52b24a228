"""How a runner started before its model learns which model to load.

The daemon may start a runner early: while the carton's blobs are still
being fetched (its command line is then already the model's, with a model
directory that is still empty), or before any load asks for one at all (a
pre-warmed spare of ``runners.prewarm``, whose command line names no model).
Such a runner is given one end of a Unix stream socket, named by
MODEL_CHANNEL_ENV. It imports its framework (and makes its GPU context)
first, then blocks on the channel until the daemon sends one message:

    4 bytes, big-endian: n; with them, as SCM_RIGHTS, the fds the message names
    n bytes of JSON: {"argv": [...] or null, "fds": ["arena", ...]}

``argv``, when given, replaces the runner's own arguments (a spare's);
``fds`` names the passed descriptors in order ("arena": the model's tensor
arena, ARENA_FD_ENV). The channel closing first means the runner is not
wanted: it exits 0. Both ends live here, so the framing is written once.
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import socket
import struct
from dataclasses import dataclass, field

MODEL_CHANNEL_ENV = "CARTONSTORE_MODEL_CHANNEL_FD"
WARM_DEVICES_ENV = "CARTONSTORE_WARM_DEVICES"   # the device a waiting runner will serve on, to warm it
MAX_MESSAGE = 1 << 20
MAX_FDS = 4
_LENGTH = struct.Struct(">I")


class ChannelError(Exception):
    """A message that is not one this module sends."""


@dataclass(frozen=True)
class ModelMessage:
    argv: list[str] | None = None
    fds: dict[str, int] = field(default_factory=dict)


async def send_model(channel: socket.socket, message: ModelMessage) -> None:
    """The daemon's end: one message, fds passed with its first bytes. On
    the daemon's event loop, without blocking it: a runner reads only once
    it has warmed up (seconds, for torch and a CUDA context), and a message
    past the socket's buffer would wait for it. The channel is left
    non-blocking."""
    names = list(message.fds)
    payload = json.dumps({"argv": message.argv, "fds": names}).encode()
    if len(payload) > MAX_MESSAGE:
        raise ChannelError(f"the runner's arguments are {len(payload)} bytes; at most {MAX_MESSAGE}")
    fds = [message.fds[name] for name in names]
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    header = _LENGTH.pack(len(payload))
    channel.setblocking(False)
    sent = channel.sendmsg([header], ancillary)   # 4 bytes into a fresh stream socket: taken whole
    await asyncio.get_running_loop().sock_sendall(channel, header[sent:] + payload)


def _recv_exactly(channel: socket.socket, size: int) -> bytes:
    parts, got = [], 0
    while got < size:
        chunk = channel.recv(size - got)
        if not chunk:
            raise ChannelError(f"the channel closed {got} bytes into a {size}-byte message")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def receive_model(channel: socket.socket) -> ModelMessage | None:
    """The runner's end: the message, or None when the daemon closed the
    channel without one. ChannelError for anything malformed."""
    header, fds, _flags, _addr = socket.recv_fds(channel, _LENGTH.size, MAX_FDS)
    if not header:
        return None
    try:
        if len(header) < _LENGTH.size:
            header += _recv_exactly(channel, _LENGTH.size - len(header))
        (size,) = _LENGTH.unpack(header)
        if size > MAX_MESSAGE:
            raise ChannelError(f"a {size}-byte message; at most {MAX_MESSAGE}")
        try:
            body = json.loads(_recv_exactly(channel, size))
        except ValueError as e:
            raise ChannelError(f"not JSON: {e}") from None
        argv, names = (body.get("argv"), body.get("fds", [])) if isinstance(body, dict) else (None, None)
        if not isinstance(names, list) or len(names) != len(fds) or not all(isinstance(n, str) for n in names) or \
                (argv is not None and not (isinstance(argv, list) and all(isinstance(a, str) for a in argv))):
            raise ChannelError(f"not a model message: {str(body)[:200]}")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return ModelMessage(argv, dict(zip(names, fds, strict=True)))
