"""Listening sockets served by the process's own accept(2), within limits.

An asyncio server accepts whatever arrives and tells its protocol only once
the connection is set up: a TLS connection belongs to no one until its
handshake ends, so a flood of them can take every descriptor the process
has. A gate counts each connection from accept(2) until whoever took it
releases its Admission: at most ``limit`` at once, and at most ``per_peer``
from one remote address (TCP). A connection over either limit is sent its
refusal (a few bytes, without waiting) and closed at once: it holds a
descriptor for the time of one accept.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from collections.abc import Callable

log = logging.getLogger("cartonstore.server")

ACCEPT_BATCH = 4             # connections taken per wakeup: 128 let a gRPC flood hold requests 1-2 s
PAUSE_WHEN_EXHAUSTED = 0.1   # seconds a listener rests when no descriptor (or kernel memory) is left
REPORT_EVERY = 10.0          # seconds between log lines about refused connections, per listener
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Admission:
    """One accepted connection's place in its gate: release() once it is closed
    (twice is harmless)."""

    __slots__ = ("_gate", "accepted_at", "peer")

    def __init__(self, gate: ConnectionGate, peer: str | None) -> None:
        self._gate: ConnectionGate | None = gate
        self.peer = peer                      # the remote address counted against per_peer (None: not counted)
        self.accepted_at = time.monotonic()

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._left(self.peer)  # noqa: SLF001 - an admission is a part of its gate


class ConnectionGate:
    """Accepts on ``sock`` (listening, non-blocking) and hands each connection
    within the limits to ``on_accepted``, which owns it from then on."""

    def __init__(self, sock: socket.socket, *, name: str, limit: int, per_peer: int = 0,
                 over_limit: bytes = b"", over_peer_limit: bytes = b"") -> None:
        self.sock = sock
        self.name = name                    # for the log: the listener, as the daemon names it
        self.limit = limit
        self._family = int(sock.family)
        self.tcp = self._family in (socket.AF_INET, socket.AF_INET6)
        self.per_peer = per_peer if self.tcp else 0
        self.over_limit = over_limit
        self.over_peer_limit = over_peer_limit
        self.open = 0
        self._by_peer: dict[str, int] = {}
        self._refused = [0, 0]              # over limit, over per_peer: since the last log line
        self._report: asyncio.TimerHandle | None = None
        self._resume: asyncio.TimerHandle | None = None
        self._rested_at = float("-inf")     # when _rest last logged
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_accepted: Callable[[socket.socket, Admission], None] | None = None

    def serve(self, on_accepted: Callable[[socket.socket, Admission], None]) -> None:
        self.sock.setblocking(False)   # one systemd passed may block: a second accept in a turn would hang the loop
        self._loop = asyncio.get_running_loop()
        self._on_accepted = on_accepted
        self._loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting (the socket is its owner's to close); connections
        already admitted go on."""
        if self._loop is not None and self._on_accepted is not None:
            self._loop.remove_reader(self.sock.fileno())
            self._on_accepted = None
        for handle in (self._resume, self._report):
            if handle is not None:
                handle.cancel()
        self._resume = self._report = None

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            if self._on_accepted is None:
                return
            try:
                fd, address = self.sock._accept()  # type: ignore[attr-defined]  # noqa: SLF001 - a bare descriptor: one refused costs no socket object
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _EXHAUSTED:
                    self._rest(e)
                    return
                continue   # ECONNABORTED and the like: that connection is gone already
            self._admit(fd, address)

    def _admit(self, fd: int, address: object) -> None:
        peer = address[0] if self.per_peer and isinstance(address, tuple) else None
        if self.open >= self.limit:
            self._refuse(fd, 0, self.over_limit)
            return
        if peer is not None and self._by_peer.get(peer, 0) >= self.per_peer:
            self._refuse(fd, 1, self.over_peer_limit)
            return
        self.open += 1
        if peer is not None:
            self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
        admission = Admission(self, peer)
        try:
            conn = socket.socket(self._family, socket.SOCK_STREAM, 0, fileno=fd)
        except OSError:
            os.close(fd)
            admission.release()
            return
        try:
            conn.setblocking(False)
            if self.tcp:   # request and answer protocols: a small answer goes out at once
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._on_accepted(conn, admission)   # type: ignore[misc]  # running: _on_accepted is set
        except Exception:  # a bug: logged, and this connection ends
            log.exception("%s: failed to take a connection", self.name)
            admission.release()
            conn.close()

    def _left(self, peer: str | None) -> None:
        self.open -= 1
        if peer is not None:
            count = self._by_peer.get(peer, 0) - 1
            if count > 0:
                self._by_peer[peer] = count
            else:
                self._by_peer.pop(peer, None)

    def _refuse(self, fd: int, why: int, refusal: bytes) -> None:
        try:
            os.set_blocking(fd, False)
            if refusal:
                os.write(fd, refusal)
            os.read(fd, 65536)   # what the client sent already: a close with it unread would be a reset
        except OSError:
            pass   # nothing to read, the client is gone, or its window is full: the close tells it
        finally:
            os.close(fd)
        self._refused[why] += 1
        if self._report is None:
            self._log_refusals()

    def _log_refusals(self) -> None:
        """One line now for what was refused since the last, then quiet for
        REPORT_EVERY (what is refused meanwhile gets the next line)."""
        self._report = None
        over_limit, over_peer = self._refused
        if not over_limit and not over_peer:
            return
        self._refused = [0, 0]
        parts = []
        if over_limit:
            parts.append(f"{over_limit} with its {self.limit} connections open")
        if over_peer:
            parts.append(f"{over_peer} from an address with {self.per_peer} open")
        log.warning("%s: refused %s", self.name, " and ".join(parts))
        self._report = self._loop.call_later(REPORT_EVERY, self._log_refusals)   # type: ignore[union-attr]  # running: the loop is set

    def _rest(self, error: OSError) -> None:
        """No descriptor left to accept with: stop taking connections (they
        wait in the kernel's backlog) for a moment rather than spin."""
        if time.monotonic() - self._rested_at > REPORT_EVERY:
            log.warning("%s: cannot accept (%s); %d connections open here", self.name, error.strerror, self.open)
            self._rested_at = time.monotonic()
        self._loop.remove_reader(self.sock.fileno())   # type: ignore[union-attr]  # running: the loop is set
        self._resume = self._loop.call_later(PAUSE_WHEN_EXHAUSTED, self._go_on)   # type: ignore[union-attr]  # running: the loop is set

    def _go_on(self) -> None:
        self._resume = None
        if self._on_accepted is not None:
            self._loop.add_reader(self.sock.fileno(), self._accept)   # type: ignore[union-attr]  # running: the loop is set
