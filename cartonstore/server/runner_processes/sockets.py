"""The directories of runner sockets: where each instance's socket lives,
and removing the ones left behind by daemons that are gone.

Several daemons may serve one store root, so each keeps its runners'
sockets in a directory of its own, ``<root>/run/runners/<owner>/``, named
by its owner token (store/root/owner.py: held by a flock while the daemon
lives, so it tells a live daemon from a gone one across PID namespaces).
A daemon never binds, connects to or removes a socket in another's."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from pathlib import Path

from cartonstore.errors import InvalidInput
from cartonstore.store.root.owner import OWNER_TOKEN, owner_is_gone
from cartonstore.system.sockets import MAX_UNIX_PATH, is_live_socket

log = logging.getLogger("cartonstore.server.runner_processes")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def ensure_run_dir(run_dir: Path) -> Path:
    """Create the socket directory (mode 0700: only the daemon's user may
    talk to its runners) or tighten an existing one."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    return run_dir


def instance_socket_path(run_dir: Path, name: str, version: str, index: int) -> Path:
    """<run_dir>/<name>-<version8>-<index>.sock. Characters a file name should
    not hold become "_"; a name that would push the path past the 107 bytes a
    Unix socket allows is shortened and made unique with a hash."""
    safe = _UNSAFE.sub("_", name) or "_"
    tail = f"-{_UNSAFE.sub('_', version)[:8]}-{index}.sock"
    path = run_dir / f"{safe}{tail}"
    room = MAX_UNIX_PATH - len(os.fsencode(run_dir)) - 1 - len(tail)
    if len(os.fsencode(path)) > MAX_UNIX_PATH:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        if room < len(digest) + 2:
            raise InvalidInput(f"runner socket directory {run_dir} is too long for Unix socket paths "
                               f"({MAX_UNIX_PATH} bytes at most)", subject=str(run_dir))
        path = run_dir / f"{safe[:room - len(digest) - 1]}~{digest}{tail}"
    return path


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def remove_socket(path: Path) -> bool:
    """Remove a socket file (nothing else) if it is there."""
    if not _is_socket(path):
        return False
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def daemon_run_dir(runners_dir: Path, owner: str) -> Path:
    """The socket directory of the daemon whose owner token is ``owner``."""
    return runners_dir / owner


def clean_stale_sockets(runners_dir: Path, tmp_dir: Path) -> list[Path]:
    """Remove the socket directories of daemons that are gone (their owner
    lock in tmp_dir is free), and loose sockets directly in runners_dir
    that nobody listens on. A live daemon's directory is left alone, and
    nothing but sockets and their emptied directories is ever removed."""
    removed: list[Path] = []
    try:
        entries = sorted(runners_dir.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        if path.is_dir() and not path.is_symlink():
            if OWNER_TOKEN.fullmatch(path.name) and owner_is_gone(tmp_dir, path.name):
                removed += _remove_sockets(path)
                try:
                    path.rmdir()
                except OSError as e:   # something not a socket in it: left, and said
                    log.warning("cannot remove %s, the runner socket directory of a daemon that is gone: %s",
                                path, e.strerror)
        elif path.name.endswith(".sock") and _is_socket(path) and not is_live_socket(path) and remove_socket(path):
            removed.append(path)
    return removed


def _remove_sockets(run_dir: Path) -> list[Path]:
    return [path for path in sorted(run_dir.iterdir()) if remove_socket(path)]
