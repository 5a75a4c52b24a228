"""Listening sockets for the daemon: its Unix socket, an optional loopback
TCP port, or sockets inherited from systemd (LISTEN_FDS)."""

from __future__ import annotations

import errno
import grp
import os
import socket
import stat
from pathlib import Path

from cartonstore.errors import Conflict, InvalidInput, Unavailable

SD_LISTEN_FDS_START = 3
MAX_UNIX_PATH = 107


def inherited_sockets(env: dict[str, str] | None = None) -> list[socket.socket]:
    """Sockets systemd passed us (socket activation), if they are for this process."""
    env = dict(os.environ) if env is None else env
    if env.get("LISTEN_PID") != str(os.getpid()):
        return []
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        return []
    socks = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        os.set_inheritable(fd, False)
        socks.append(socket.socket(fileno=fd))
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(key, None)  # children must not think they were activated
    return socks


def is_live_socket(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket at path."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as e:
        return e.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()


def bind_unix(path: Path, *, mode: int = 0o660, group: str | None = None, private_dir: bool = False) -> socket.socket:
    """Bind a Unix socket at path. A live socket there belongs to another
    daemon and is left alone (Conflict); a stale one from a crash is replaced;
    anything else at that path is an error. ``private_dir``: its directory
    is the caller's alone (0700), so nobody can connect before the mode is
    set, and the process-wide umask is left alone (files other threads
    create meanwhile keep their modes)."""
    if (size := len(os.fsencode(path))) > MAX_UNIX_PATH:
        raise InvalidInput(f"socket path {path} is {size} bytes, "
                           f"longer than the {MAX_UNIX_PATH}-byte limit of Unix sockets")
    if not path.parent.is_dir():
        raise InvalidInput(f"cannot create socket {path}: directory {path.parent} does not exist", subject=str(path))
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise InvalidInput(f"{path} exists and is not a socket; refusing to replace it", subject=str(path))
        if is_live_socket(path):
            raise Conflict(f"another daemon is already serving {path}", subject=str(path))
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = None if private_dir else os.umask(0o177)  # nobody may connect before the mode is set
    try:
        sock.bind(str(path))
    except OSError as e:
        sock.close()
        raise Unavailable(f"cannot bind {path}: {e.strerror}", subject=str(path)) from e
    finally:
        if old is not None:
            os.umask(old)
    try:
        if group:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise InvalidInput(f"socket group {group!r} does not exist") from None
            os.chown(path, -1, gid)
        os.chmod(path, mode)
        sock.listen(1024)
    except BaseException:
        sock.close()
        path.unlink(missing_ok=True)
        raise
    sock.setblocking(False)
    return sock


def bind_tcp(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        port_no = int(port)
    except ValueError:
        raise InvalidInput(f"listen address {listen!r} is not HOST:PORT") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port_no))
    except OSError as e:
        sock.close()
        raise Unavailable(f"cannot listen on {listen}: {e.strerror}") from e
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def describe_socket(sock: socket.socket, *, tls: bool = False) -> str:
    addr = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix:{addr}"
    host, port = addr[0], addr[1]
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def notify(message: str, env: dict[str, str] | None = None) -> bool:
    """sd_notify: tell systemd READY=1 / STOPPING=1 when NOTIFY_SOCKET is set."""
    target = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not target:
        return False
    addr = "\0" + target[1:] if target.startswith("@") else target
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
            s.sendall(message.encode())
        except OSError:
            return False
    return True
