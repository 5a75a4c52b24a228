"""What the inference core gives a door back: the runner's answer as the
client gets it (over HTTP: its status, headers and bytes, some of them
views of an arena slot; over gRPC: the parsed outputs a door turns into
its own message), and how a big answer leaves a socket without copies."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from typing import Any

from cartonstore.v2.wire_types import WireTensor

STREAM_ANSWER = 64 * 1024         # larger answers: headers and body written apart, so neither is copied
CLIENT_SEND_BUFFER = 4 << 20      # a 4 MiB answer leaves in one send, not copied into asyncio's buffer


@dataclass
class InferAnswer:
    """What the runner answered, as the client gets it (maybe compressed)."""

    status: int
    headers: dict[str, str]
    payload: bytes | bytearray | memoryview
    error_text: str | None = None   # for the daemon's log line, on errors
    tail: list[memoryview] = field(default_factory=list)   # sent after payload (views of an arena slot)
    converted: Any = None   # the answer in a door's own form (infer's convert)
    doc: dict[str, Any] | None = None   # a 200 for tensors: the runner's JSON header, parsed once
    outputs: list[WireTensor] = field(default_factory=list)   # ... its outputs, as the client is to see them

    @property
    def size(self) -> int:
        return len(self.payload) + sum(len(part) for part in self.tail)

    def joined(self) -> bytes | bytearray | memoryview:
        return b"".join([self.payload, *self.tail]) if self.tail else self.payload


def widen_send_buffer(transport: asyncio.BaseTransport | None) -> None:
    """A big answer leaves a Unix socket in one send, not copied into the
    transport's buffer (TCP tunes its own buffers)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None and sock.family == socket.AF_UNIX:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CLIENT_SEND_BUFFER)
