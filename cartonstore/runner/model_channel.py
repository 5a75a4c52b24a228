"""Both ends of the model channel, which tells a runner started before
its model which model to load: the daemon may start one while the
carton's blobs are still being fetched, or as a pre-warmed spare of
``runners.prewarm``. The message and its framing are protocol.py's (4);
they are read and written here alone.
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import socket
from dataclasses import dataclass, field

from .protocol import MODEL_CHANNEL_LENGTH, MODEL_CHANNEL_MAX_FDS, MODEL_CHANNEL_MAX_MESSAGE


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
    if len(payload) > MODEL_CHANNEL_MAX_MESSAGE:
        raise ChannelError(f"the runner's arguments are {len(payload)} bytes; at most {MODEL_CHANNEL_MAX_MESSAGE}")
    fds = [message.fds[name] for name in names]
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    header = MODEL_CHANNEL_LENGTH.pack(len(payload))
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
    header, fds, _flags, _addr = socket.recv_fds(channel, MODEL_CHANNEL_LENGTH.size, MODEL_CHANNEL_MAX_FDS)
    if not header:
        return None
    try:
        if len(header) < MODEL_CHANNEL_LENGTH.size:
            header += _recv_exactly(channel, MODEL_CHANNEL_LENGTH.size - len(header))
        (size,) = MODEL_CHANNEL_LENGTH.unpack(header)
        if size > MODEL_CHANNEL_MAX_MESSAGE:
            raise ChannelError(f"a {size}-byte message; at most {MODEL_CHANNEL_MAX_MESSAGE}")
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
