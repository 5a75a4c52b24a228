"""Who owns what in tmp/: one owner token per process, held by a lock.

Every file or directory a process creates in tmp/ carries its token in its
name (``<kind>-<token>-<random>``), and the process holds a shared flock on
``tmp/owner-<token>.lock`` for as long as it lives. gc may delete a tmp/
entry only after taking that lock exclusively, which succeeds only once the
owner is gone. flock works across PID namespaces, so containers sharing a
store cannot mistake each other's work for garbage the way PID checks would.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
from pathlib import Path

from cartonstore.errors import Unavailable

_lock = threading.Lock()
_owners: dict[Path, tuple[int, str, int]] = {}  # tmp dir -> (pid, token, fd)
OWNER_TOKEN = re.compile(r"[0-9a-f]{12}")   # what owner_token() makes: six random bytes in hex
TOKEN_RE = re.compile(rf"^(?:ingest|model|upload|owner)-({OWNER_TOKEN.pattern})[-.]")


def owner_token(tmp_dir: Path) -> str:
    """This process's token for tmp_dir (created and locked on first use)."""
    with _lock:
        held = _owners.get(tmp_dir)
        if held is not None and held[0] == os.getpid():
            return held[1]
        token = os.urandom(6).hex()  # secrets.token_hex, without importing secrets (hashlib, random)
        try:
            fd = os.open(tmp_dir / f"owner-{token}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise Unavailable(f"cannot create files in {tmp_dir}: {e.strerror}", subject=str(tmp_dir)) from e
        fcntl.flock(fd, fcntl.LOCK_SH)
        _owners[tmp_dir] = (os.getpid(), token, fd)
        return token


def tmp_name(tmp_dir: Path, kind: str) -> Path:
    return tmp_dir / f"{kind}-{owner_token(tmp_dir)}-{os.urandom(6).hex()}"


def token_of(name: str) -> str | None:
    m = TOKEN_RE.match(name)
    return m.group(1) if m else None


def owner_is_gone(tmp_dir: Path, token: str) -> bool:
    """True when no live process holds the owner lock of token (or it has none)."""
    path = tmp_dir / f"owner-{token}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def lease_owner(lease_id: str) -> str | None:
    """The owner token of a lease a process took in its own name
    (``<kind>:<token>:<what>``), else None."""
    parts = lease_id.split(":", 2)
    return parts[1] if len(parts) == 3 and OWNER_TOKEN.fullmatch(parts[1]) else None


def hold_identity(locks_dir: Path, identity: str) -> int:
    """Hold the lock of a daemon identity for as long as this process lives
    (the descriptor returned; closing it lets go). Unavailable when a live
    daemon already holds it: two daemons with one identity would load and
    forget each other's models at each restart."""
    import hashlib  # here, not at the top: the CLI's fast ls and path import this module
    path = locks_dir / f"daemon-{hashlib.sha256(identity.encode()).hexdigest()[:32]}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise Unavailable(f"cannot create {path}: {e.strerror}", subject=str(path)) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Unavailable(f"another daemon on this store is running as server.id {identity!r} (it holds {path}); "
                          "give each daemon its own server.id (CARTONSTORE_ID)", subject=identity) from None
    return fd
