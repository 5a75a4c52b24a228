"""Why this process may not use a file, in words a user can act on:
"/var/lib/cartonstore/index.db is owned by root:cartonstore, mode 0640:
join group cartonstore or run as root".

The kernel decides (os.access with the effective ids and every group this
process holds); the mode bits only choose the advice: the group to join
where its bits would let this process in, else the owner to run as.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

READ = os.R_OK
WRITE = os.W_OK

_VERBS = {READ: "read", WRITE: "write", os.X_OK: "pass through"}
_BITS = {  # (owner, group, others) bits each kind of access needs
    READ: (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH),
    WRITE: (stat.S_IWUSR, stat.S_IWGRP, stat.S_IWOTH),
    os.X_OK: (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH),
}


def _may(path: Path, want: int) -> bool:
    return os.access(path, want, effective_ids=os.access in os.supports_effective_ids)


def denial(path: str | os.PathLike[str], want: int = READ) -> str | None:
    """None when this process may ``want`` (READ or WRITE) ``path``, and
    pass through every directory above it; else one line naming the first
    of them that stops it, its owner, group and mode, and what would let
    this process in. Writing a file that does not exist yet means writing
    its directory; reading one is no permission problem (None)."""
    target = Path(os.path.abspath(path))
    for directory in reversed(target.parents):   # "/" first
        if not _may(directory, os.X_OK):
            return _line(directory, os.X_OK, want)
    try:
        os.lstat(target)
    except FileNotFoundError:
        return _line(target.parent, WRITE, want) if want == WRITE and not _may(target.parent, WRITE) else None
    except OSError:
        return None
    return None if _may(target, want) else _line(target, want, want)


def explained(error: PermissionError) -> str:
    """A PermissionError in one line: the file, and who may use it."""
    if error.filename is None:
        return f"permission denied: {error.strerror}"
    why = denial(error.filename, READ) or denial(error.filename, WRITE)
    return f"permission denied: {why or error.filename}"


def _line(path: Path, need: int, want: int) -> str:
    """The line for ``path``, which stops this process from ``need`` on the
    way to ``want``: its group is worth joining only if it may ``need``
    there, and write there too where the end is a write (a store's group
    reads it, its owner writes it)."""
    st = os.stat(path)
    owner, group = _user(st.st_uid), _group(st.st_gid)
    mode = stat.S_IMODE(st.st_mode)
    owner_bit, group_bit, other_bit = _BITS[need]
    group_may = mode & group_bit and (want != WRITE or mode & stat.S_IWGRP)
    runs_as = "root" if st.st_uid == 0 else f"{owner} or root"
    if group_may and st.st_gid not in {os.getegid(), *os.getgroups()}:
        advice = f"join group {group} (then log in again) or run as {runs_as}"
    elif mode & owner_bit and st.st_uid != os.geteuid():
        advice = f"run as {runs_as}"
    elif mode & (owner_bit | group_bit | other_bit):
        advice = "its mode would let this user in: an ACL or a security module refuses"
    else:
        advice = f"only root may {_VERBS[need]} it"
    return f"{path} is owned by {owner}:{group}, mode {mode:04o}: {advice}"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
