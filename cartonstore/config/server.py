"""[server]: how the daemon is reached and how it logs (read by cartonstore.config).

    [server]
    socket = ""                 # "": ROOT/cartonstore.sock; for /var/lib/cartonstore, /run/cartonstore/cartonstore.sock
    socket_mode = "0660"
    socket_group = ""           # "": the daemon's group
    listen = ""                 # "" or HOST:PORT for a TCP listener
    grpc = true                 # the v2 gRPC service on a Unix socket beside the HTTP one (TCP: grpc_listen)
    grpc_socket = ""            # "": the HTTP socket's path with .grpc before its suffix
    grpc_listen = ""            # "" or HOST:PORT for gRPC over TCP
    restore_loaded = true       # a restarted daemon loads again what it had loaded
    id = ""                     # the daemon's identity its loaded models are kept under; "": its socket path
    token_file = ""             # the Bearer token TCP callers must send (or token = "...")
    max_connections = 4096      # per listener; max_connections_per_peer = 256 from one TCP address
    head_timeout = "10s"        # a request head must be whole within it; idle_timeout = "75s" between requests
    max_buffered = "1GiB"       # request bodies in memory at once, all connections together
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cartonstore.errors import InvalidInput

from . import values as v

_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?|[0-9]+")


def _group(value: object) -> str:
    if value == "" or (isinstance(value, str) and _GROUP.fullmatch(value)):
        return value
    raise v.BadValue(f'expected a group name or number (or "" for the daemon\'s group), got {value!r}')


def _mode(value: object) -> int:
    if isinstance(value, str) and re.fullmatch(r"(0o|0)?[0-7]{3}", value.strip()):
        return int(value.strip(), 8)
    raise v.BadValue(f'expected permission bits as an octal string such as "0660", got {value!r}')


_LISTEN = re.compile(r"(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>[0-9]{1,5})")


def _split_listen(text: str) -> tuple[str, int]:
    match = _LISTEN.fullmatch(text)
    if match and int(match["port"]) <= 65535:
        if match["host"]:
            return match["host"], int(match["port"])
        import ipaddress  # here, not at the top: only a listen address needs it (`path` starts fast)

        try:
            ipaddress.IPv6Address(match["ipv6"])
            return match["ipv6"], int(match["port"])
        except ValueError:
            pass
    raise v.BadValue(f'expected HOST:PORT such as 127.0.0.1:8000 or [::1]:8000 (or "" for no TCP '
                     f"port), got {text!r}")


def _listen(value: object) -> str:
    if not isinstance(value, str):
        raise v.BadValue(f"expected HOST:PORT as a string, got {value!r}")
    if value:
        _split_listen(value)
    return value


_IDENTITY = re.compile(r"[A-Za-z0-9_.:/@-]{1,200}")


def _identity(value: object) -> str:
    if value == "" or (isinstance(value, str) and _IDENTITY.fullmatch(value)):
        return value
    raise v.BadValue("expected an identity of 1 to 200 letters, digits and '_', '.', ':', '/', '@', '-' "
                     f'(or "" for the socket\'s path), got {value!r}')


def _show_mode(mode: int) -> str:
    return f"{mode:04o}"


_AT_LEAST_0 = v.integer(0)


def _workers(value: object) -> int | None:
    """A worker count, or None for "auto"."""
    return None if value == "auto" else _AT_LEAST_0(value)


def _show_workers(count: int | None) -> str | int:
    return "auto" if count is None else count


@dataclass(frozen=True)
class ServerSettings:
    """[server]: how the daemon is reached and how it logs."""

    # None: store.layout.default_socket of the root (Config.socket_path)
    socket: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    socket_mode: int = v.setting(0o660, _mode, _show_mode)
    socket_group: str = v.setting("", _group)
    listen: str = v.setting("", _listen)  # "" or HOST:PORT, see listen_address
    allow_remote_listen: bool = v.setting(False, v.boolean)
    grpc: bool = v.setting(True, v.boolean)
    # None: the HTTP socket's path with ".grpc" before its suffix (Config.grpc_socket_path)
    grpc_socket: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    grpc_listen: str = v.setting("", _listen)  # "" or HOST:PORT (TLS and credentials as listen's)
    restore_loaded: bool = v.setting(True, v.boolean)  # load again at start what this daemon (id) had loaded
    # Who this daemon is to the store: what it loaded is kept under it, for its next start in any container
    # (its socket path may differ); one live daemon per id on a store. "": the socket's path.
    id: str = v.setting("", _identity)
    log_format: str = v.setting("text", v.choice("text", "json"))
    log_level: str = v.setting("info", v.choice("debug", "info", "warning", "error"))
    access_log: bool = v.setting(False, v.boolean)
    max_request_size: int = v.size_setting(256 << 20, 1)
    # request bodies held in memory at once, every connection's together (one that finds no room: 503)
    max_buffered: int = v.size_setting(1 << 30, 1)
    # connections each listener holds at once, and from one address over TCP (past either: 503 and closed)
    max_connections: int = v.setting(4096, v.integer(1))
    max_connections_per_peer: int = v.setting(256, v.integer(1))
    head_timeout: float = v.duration_setting(10.0, positive=True)   # a request's whole head, however it drips
    idle_timeout: float = v.duration_setting(75.0, positive=True)   # a connection between requests (gRPC: RPCs)
    shared_memory_over_tcp: bool = v.setting(False, v.boolean)  # Triton's system shared memory, off TCP by default
    # a path on the daemon's host as a load's source or a lease's model over TCP (no uid to read it as)
    allow_tcp_local_sources: bool = v.setting(False, v.boolean)
    arena_size: int = v.size_setting(1 << 30, 0)  # shared memory for big tensors between daemon and runners; 0: none
    # processes that check big JSON infer requests off the event loop; 0: a thread of the daemon's
    check_workers: int | None = v.setting(None, _workers, _show_workers)  # None: "auto"
    shutdown_timeout: float = v.duration_setting(10.0, positive=False)
    # TLS on the TCP listener (PEM files; the key may be in tls_cert); with tls_client_ca, /v1/blobs takes
    # only clients with a certificate it signed. Checked when the daemon starts.
    tls_cert: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    tls_key: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    tls_client_ca: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()
    # The Bearer token every TCP caller must send (server/calls/access.py); prefer token_file, kept out of this file.
    token: str = v.token_setting()
    token_file: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()

    def api_token(self) -> str:
        """server.token, or the one in server.token_file ("" for none)."""
        return v.read_token(self.token_file, "server.token_file") if self.token_file is not None else self.token

    @property
    def check_worker_count(self) -> int:
        """check_workers, "auto" being one per core this process may use, at
        most 8 (each holds a request's parsed JSON, tens of MiB for a million
        values, while it works)."""
        return max(1, min(8, len(os.sched_getaffinity(0)))) if self.check_workers is None else self.check_workers

    @property
    def grpc_listen_address(self) -> tuple[str, int] | None:
        return _split_listen(self.grpc_listen) if self.grpc_listen else None

    @property
    def listen_address(self) -> tuple[str, int] | None:
        """(host, port) of the TCP listener, IPv6 without brackets; None for none."""
        return _split_listen(self.listen) if self.listen else None

    def socket_gid(self) -> int | None:
        """The group id for the socket, None to keep the daemon's. Raises
        InvalidInput if the group does not exist on this host."""
        if not self.socket_group:
            return None
        if self.socket_group.isdigit():
            return int(self.socket_group)
        import grp

        try:
            return grp.getgrnam(self.socket_group).gr_gid
        except KeyError:
            raise InvalidInput(f"server.socket_group: no group named {self.socket_group!r} on "
                               f"this host", subject="server.socket_group") from None
