"""A root's own view of the host, for tests of what root gets by default:
processes run in a mount namespace of their own where /var/lib and /run
are overlays (the host's files below, this test's writes in a tmpfs above),
so a daemon on root's default store (/var/lib/cartonstore, its socket in
/run/cartonstore) makes its directories and binds its socket there, as on
a fresh machine, without touching the host or meeting another test's
daemon. A directory may be bound in too (a Python placed under a 0700
directory). The namespace lives as long as its first process; others
join it with nsenter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

OVERLAID = ("/var/lib", "/run")

_SETUP = r"""
set -e
mount -t tmpfs -o mode=0755 hostview "$HOSTVIEW_SCRATCH"
for d in $HOSTVIEW_OVERLAID; do
    name=$(echo "$d" | tr / _)
    mkdir -p "$HOSTVIEW_SCRATCH/$name/upper" "$HOSTVIEW_SCRATCH/$name/work"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$HOSTVIEW_SCRATCH/$name/upper,workdir=$HOSTVIEW_SCRATCH/$name/work" "$d"
done
while [ -n "$HOSTVIEW_BINDS" ]; do
    pair=${HOSTVIEW_BINDS%%;*}; HOSTVIEW_BINDS=${HOSTVIEW_BINDS#*;}
    mkdir -p "${pair#*=}"
    mount --bind "${pair%%=*}" "${pair#*=}"
done
unset HOSTVIEW_SCRATCH HOSTVIEW_OVERLAID HOSTVIEW_BINDS
exec "$@"
"""


def why_not() -> str | None:
    """Why a host view cannot be made here, or None."""
    if os.geteuid() != 0:
        return "a mount namespace of the test's own needs root"
    missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} (util-linux) not installed"
    overlay = ("mount -t tmpfs probe /mnt && mkdir /mnt/u /mnt/w && "
               "mount -t overlay overlay -o lowerdir=/run,upperdir=/mnt/u,workdir=/mnt/w /run")
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", overlay],
                           capture_output=True, text=True, check=False)
    if probe.returncode:
        return f"cannot make an overlay in a mount namespace here: {probe.stderr.strip()}"
    return None


def argv(scratch: Path, command: list[str], binds: dict[Path, Path] | None = None) -> list[str]:
    """``command`` run in a new host view; ``scratch`` (an empty directory)
    becomes its tmpfs; ``binds`` maps a directory to where it appears."""
    scratch.mkdir(parents=True, exist_ok=True)
    spec = "".join(f"{source}={target};" for source, target in (binds or {}).items())
    return ["env", f"HOSTVIEW_SCRATCH={scratch}", f"HOSTVIEW_OVERLAID={' '.join(OVERLAID)}", f"HOSTVIEW_BINDS={spec}",
            "unshare", "--mount", "--propagation", "private", "bash", "-c", _SETUP, "hostview", *command]


def joined(pid: int, command: list[str]) -> list[str]:
    """``command`` run in the host view whose first process is ``pid``, in
    that process's working directory (entering a mount namespace starts at
    its root)."""
    return ["nsenter", f"--target={pid}", "--mount", "--wd", "--", *command]


def seen_by(pid: int, path: str | Path) -> Path:
    """``path`` as the host view of ``pid`` has it, for this process to read."""
    return Path(f"/proc/{pid}/root") / str(path).lstrip("/")
