"""What a runner reads by path: its Python's directories, and whether a
uid can pass down to a path (Landlock alone, with no mount namespace to
bind it in, reads as the runner's uid)."""

from __future__ import annotations

import os
import site
import stat
import sys
from pathlib import Path

import cartonstore


def unreachable(path: str, uid: int, gid: int) -> str | None:
    """The first directory above path that uid cannot pass through, if any."""
    p = Path(path)
    for d in [*reversed(p.parents), p] if p.is_dir() else reversed(p.parents):
        try:
            st = os.stat(d)
        except OSError:
            return None
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
        if not st.st_mode & bit:
            return f"{d} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid})"
    return None


def python_paths() -> tuple[str, ...]:
    """What the runner's Python reads: its prefixes, its site directories and
    this package (an editable install lives outside site-packages), each
    resolved through symlinks (a site-packages that is a link is bound where
    it points). Not the daemon's working directory, which sys.path may name."""
    raw = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    prefixes = {os.path.realpath(p) for p in raw} | {os.path.dirname(os.path.realpath(sys.executable))}
    under = tuple(p.rstrip(os.sep) + os.sep for p in raw | prefixes)
    sites = {os.path.realpath(p) for p in (*sys.path, *site.getsitepackages())
             if p and os.path.isdir(p) and (os.path.abspath(p).startswith(under)
                                            or os.path.realpath(p).startswith(under))}
    package = os.path.dirname(os.path.realpath(cartonstore.__file__))
    return tuple(sorted(prefixes | sites | {package, sys.prefix}))
