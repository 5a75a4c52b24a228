"""The directory of runner sockets: where each instance's socket lives and
removing the ones left behind by runners that are gone."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from pathlib import Path

from cartonstore.errors import InvalidInput
from cartonstore.system.sockets import MAX_UNIX_PATH, is_live_socket

log = logging.getLogger("cartonstore.server.runners")

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


def clean_stale_sockets(run_dir: Path) -> list[Path]:
    """Remove the sockets in run_dir nobody listens on (runners of a daemon
    that crashed). A socket that still answers is left alone and logged:
    some process still serves it. Other files are never touched."""
    removed: list[Path] = []
    try:
        entries = sorted(run_dir.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        if not path.name.endswith(".sock") or not _is_socket(path):
            continue
        if is_live_socket(path):
            log.warning("runner socket %s is still served by a live process; leaving it", path)
            continue
        if remove_socket(path):
            removed.append(path)
    return removed
