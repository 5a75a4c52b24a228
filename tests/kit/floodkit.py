"""Floods of connections for tests and benches of the daemon's connection
budgets (tests/server/test_connection_budget.py, tests/bench/bench_flood.py):
child processes that each open and hold up to PER_CHILD sockets from an
epoll loop (stalled, dripping header lines, or sending a protocol's first
bytes), recording when and how the daemon ended each, and a probe of the
daemon's HTTP Unix socket from another process meanwhile."""

from __future__ import annotations

import errno
import itertools
import json
import multiprocessing
import os
import select
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from kit.daemonkit import DaemonProcess

PER_CHILD = 10000     # connections one flooding process holds (a hard limit of 20,000 may not be raised)
DEADLINE = 2.0        # head_timeout and idle_timeout of the flooded daemons
SLACK = 6.0           # on a loaded 2-core machine: accept backlog, the sweep's period, grpcio's 10% jitter
CAP = 1000            # max_connections of the flooded daemons: reached, at the rate they are flooded
DAEMON_CONFIG = (f'[server]\nhead_timeout = "{DEADLINE:g}s"\nidle_timeout = "{DEADLINE:g}s"\nmax_buffered = "256MiB"\n'
          f'max_connections = {CAP}\n')
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">I", 0)[1:] + bytes([4, 0]) + struct.pack(">I", 0)


# -- the flood -------------------------------------------------------------------------


@dataclass
class Flooder:
    """One connection of a flood: what it sends, and what came of it."""

    family: int
    address: object
    source: str | None = None
    first: bytes = b""                 # sent once connected
    drip: bytes = b""                  # then sent every DRIP seconds
    sock: socket.socket | None = None
    connected_at: float | None = None
    resent: bool = False               # its kernel had to send something again (see Flood.run)
    seen_late: bool = False            # seen open DEADLINE + SLACK after its connect (see Flood._check_late)
    closed_at: float | None = None
    received: bytes = b""
    next_drip: float = 0.0


DRIP = 0.5      # seconds between a dripping connection's header lines
RATE = 600.0    # connections a flooding process opens a second (all of them: 25,000 in ~17 s)


@dataclass
class Flood:
    """Connections opened in one epoll loop, watched until the daemon closes each."""

    waiting: deque[Flooder] = field(default_factory=deque)   # to connect
    open: dict[int, Flooder] = field(default_factory=dict)
    drips: deque[Flooder] = field(default_factory=deque)      # connected drippers, the next to drip first
    connected: deque[Flooder] = field(default_factory=deque)  # in the order they connected, to be checked
    epoll: select.epoll = field(default_factory=select.epoll)

    def add(self, count: int, family: int, address: object, *, sources: list[str] | None = None,
            first: bytes = b"", drip: bytes = b"") -> list[Flooder]:
        made = [Flooder(family, address, sources[i % len(sources)] if sources else None, first, drip)
                for i in range(count)]
        self.waiting.extend(made)
        return made

    def _connect(self, budget: int) -> int:
        """Start up to ``budget`` connections; how many of it are left."""
        while budget > 0 and self.waiting:
            f = self.waiting.popleft()
            if f.sock is None:
                f.sock = socket.socket(f.family, socket.SOCK_STREAM)
                f.sock.setblocking(False)
                if f.source:
                    f.sock.bind((f.source, 0))
            if f.sock.connect_ex(f.address) == errno.EAGAIN:   # a Unix socket's backlog is full: next turn
                self.waiting.appendleft(f)
                return budget
            budget -= 1
            self.open[f.sock.fileno()] = f
            self.epoll.register(f.sock.fileno(), select.EPOLLOUT | select.EPOLLIN | select.EPOLLRDHUP)
        return budget

    def run(self, until: float, *, rate: float = RATE) -> None:
        """Connect (``rate`` a second), send, drip and watch until every
        connection was closed, or ``until``.

        A flood overflows the daemon's backlog: the kernel then answers a
        handshake with a SYN cookie and drops the ACK, so the client holds a
        connection the server does not, until its first bytes, resent,
        find room, seconds later. Such a connection is marked ``resent``
        (TCP_INFO's total_retrans): the daemon's deadlines run from its
        accept, which its client cannot see.

        Whether the daemon closed a connection in time is asked of the
        kernel (_check_late), not judged from when this loop saw the close:
        on a loaded machine this process may see it seconds later."""
        started, made = time.monotonic(), 0
        while (self.waiting or self.open) and time.monotonic() < until:
            due = int((time.monotonic() - started) * rate) - made
            made += due - self._connect(due)
            now = time.monotonic()
            self._check_late(now)
            while self.drips and self.drips[0].next_drip <= now:
                f = self.drips.popleft()
                if f.closed_at is None:
                    self._send(f, f.drip)
            for fd, events in self.epoll.poll(0.02):
                f = self.open.get(fd)
                if f is None:
                    continue
                if events & select.EPOLLOUT and f.connected_at is None:
                    self._connected(fd, f)
                elif events & (select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR):
                    self._read(fd, f)

    def _check_late(self, now: float) -> None:
        """Mark the connections still open DEADLINE + SLACK after their
        connect: those the daemon has not closed (no end-of-stream from it
        waits in the kernel), save those the kernel held back (resent)."""
        while self.connected and self.connected[0].connected_at + DEADLINE + SLACK <= now:   # type: ignore[operator]  # connected: it has its time
            f = self.connected.popleft()
            if f.closed_at is not None:
                continue
            hung_up = select.poll()
            hung_up.register(f.sock, select.POLLRDHUP)   # POLLHUP and POLLERR come unasked
            if not hung_up.poll(0):
                f.seen_late = not self._resent(f)

    def _resent(self, f: Flooder) -> bool:
        if f.family == socket.AF_UNIX:   # (a full Unix backlog refuses the connect itself)
            return False
        info = f.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)   # type: ignore[union-attr]  # a flooder in the epoll has its socket
        return struct.unpack_from("I", info, 100)[0] > 0   # tcpi_total_retrans

    def _connected(self, fd: int, f: Flooder) -> None:
        if f.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):   # type: ignore[union-attr]  # a flooder in the epoll has its socket
            self._closed(f)   # refused outright: counted as closed at once
            return
        f.connected_at = time.monotonic()
        self.connected.append(f)
        self.epoll.modify(fd, select.EPOLLIN | select.EPOLLRDHUP)
        if f.first:
            self._send(f, f.first)

    def _send(self, f: Flooder, data: bytes) -> None:
        try:
            f.sock.send(data)   # type: ignore[union-attr]  # a flooder in the epoll has its socket
        except BlockingIOError:
            pass
        except OSError:
            self._closed(f)
            return
        if f.drip:
            f.next_drip = time.monotonic() + DRIP
            self.drips.append(f)

    def _read(self, fd: int, f: Flooder) -> None:
        try:
            data = f.sock.recv(65536)   # type: ignore[union-attr]  # a flooder in the epoll has its socket
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            f.received += data
        else:
            self._closed(f)

    def _closed(self, f: Flooder) -> None:
        f.closed_at = time.monotonic()
        f.resent = self._resent(f)
        fd = f.sock.fileno()   # type: ignore[union-attr]  # a flooder in the epoll has its socket
        self.epoll.unregister(fd)
        f.sock.close()   # type: ignore[union-attr]  # a flooder in the epoll has its socket
        del self.open[fd]

    def close(self) -> None:
        for f in [*self.open.values(), *self.waiting]:
            if f.sock is not None:
                f.sock.close()
        self.epoll.close()


def sources(count: int, third: int = 1) -> list[str]:
    """Loopback addresses to connect from, one per would-be client host."""
    return [f"127.0.{third}.{i}" for i in range(1, count + 1)]


def tcp_address(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


@dataclass(frozen=True)
class Group:
    """``count`` connections alike."""

    name: str
    count: int
    family: int
    address: object
    sources: tuple[str, ...] = ()
    first: bytes = b""
    drip: bytes = b""


def summary(flooders: list[Flooder]) -> dict[str, object]:
    """What came of a group: how each connection ended, by the first line
    it was answered (b"" for none), one whole answer of each kind, how many
    the kernel held back (resent), and how many of the others the daemon had
    not closed within DEADLINE + SLACK of their connect (or ever)."""
    ends: dict[bytes, int] = {}
    samples: dict[bytes, bytes] = {}
    for f in flooders:
        line = f.received.split(b"\r\n", 1)[0] if f.received.startswith(b"HTTP/") else b""
        ends[line] = ends.get(line, 0) + 1
        samples.setdefault(line, f.received[:800])
    late = [f for f in flooders if f.closed_at is None or f.connected_at is None or f.seen_late]
    return {"ends": ends, "samples": samples, "late": len(late),
            "still_open": sum(f.closed_at is None for f in flooders),
            "resent": sum(f.resent for f in flooders)}


def _flood_child(groups: list[Group], seconds: float, report: Connection) -> None:
    os.nice(10)   # an attacker's CPU is its own: here it shares two cores with the daemon and the probe
    flood = Flood()
    made = {g.name: flood.add(g.count, g.family, g.address, sources=list(g.sources), first=g.first, drip=g.drip)
            for g in groups}
    flood.waiting = deque(f for alike in itertools.zip_longest(*made.values()) for f in alike if f is not None)
    try:
        flood.run(time.monotonic() + seconds)
        report.send({name: summary(flooders) for name, flooders in made.items()})
    finally:
        flood.close()


class Floods:
    """Groups of connections, each batch flooding from a process of its own
    (at most PER_CHILD connections each: a descriptor apiece)."""

    def __init__(self, batches: list[list[Group]], seconds: float) -> None:
        context = multiprocessing.get_context("fork")
        self.children = []
        for groups in batches:
            assert sum(g.count for g in groups) <= PER_CHILD
            mine, theirs = context.Pipe(duplex=False)
            child = context.Process(target=_flood_child, args=(groups, seconds, theirs))
            child.start()
            theirs.close()
            self.children.append((child, mine))
        self.seconds = seconds

    def outcome(self) -> dict[str, dict[str, object]]:
        got: dict[str, dict[str, object]] = {}
        try:
            for _child, pipe in self.children:
                assert pipe.poll(self.seconds + 30), "a flooding process did not report"
                got.update(pipe.recv())
        finally:
            for child, _ in self.children:
                child.join(10)
                if child.is_alive():
                    child.kill()
                    child.join()
        return got


def issue_flood(d: DaemonProcess, seconds: float) -> Floods:
    """Issue 37's: 20,000 TCP connections (HTTP stalled after its request
    line or dripping a header line every DRIP seconds, gRPC sending its
    preface and nothing more) and 5,000 to the gRPC Unix socket, from 40
    loopback addresses, none with a credential."""
    http, grpc_tcp = tcp_address(d.http_url), tcp_address("grpc://" + d.grpc_host_port)
    many = tuple(sources(40))
    return Floods([
        [Group("stalled", 5000, socket.AF_INET, http, many, first=b"GET /v2/models HTTP/1.1\r\n"),
         Group("dripping", 5000, socket.AF_INET, http, many, first=b"GET /v2/models HTTP/1.1\r\n",
               drip=b"X-Drip: a\r\n")],
        [Group("grpc tcp", 10000, socket.AF_INET, grpc_tcp, many, first=H2_PREFACE)],
        [Group("grpc unix", 5000, socket.AF_UNIX, d.grpc_unix[len("unix://"):], first=H2_PREFACE)],
    ], seconds=seconds)


# -- probing the Unix socket meanwhile ------------------------------------------------

PROBE = r"""
import json, socket, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
results, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    started = time.monotonic()
    try:
        with socket.socket(socket.AF_UNIX) as s:   # a fresh connection each time: each needs a descriptor
            s.settimeout(10)
            s.connect(path)
            s.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        status = int(got.split(b" ", 2)[1]) if got else 0
    except OSError as e:
        status = str(e)
    results.append((status, time.monotonic() - started))
    time.sleep(0.02)
print(json.dumps(results))
"""


class Probe:
    """Requests on the daemon's HTTP Unix socket from another process, for ``seconds``."""

    def __init__(self, d: DaemonProcess, seconds: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PROBE, str(d.socket_path), str(seconds)],
                                     stdout=subprocess.PIPE, text=True)

    def results(self) -> list[tuple[int | str, float]]:
        out, _ = self.proc.communicate(timeout=120)
        return [tuple(r) for r in json.loads(out)]


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
