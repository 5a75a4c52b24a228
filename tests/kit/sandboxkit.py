"""Whether runners can be sandboxed here the way a root daemon does it, and as whom."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

from cartonstore.server.runner_processes.sandbox import unreachable


def runner_user() -> pwd.struct_passwd | None:
    for name in ("cartonstore-runner", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    return None


def why_not(mode: str) -> str | None:
    if os.geteuid() != 0:
        return "runners change user only under a root daemon: run as root"
    user = runner_user()
    if user is None:
        return "no unprivileged user (cartonstore-runner or nobody) to run runners as"
    if mode == "bwrap" and subprocess.run(["which", "bwrap"], capture_output=True).returncode:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    # Under bubblewrap what the runner reads is bound in as root; Landlock alone reads it as that user.
    blocked = mode != "bwrap" and unreachable(os.path.realpath(sys.executable), user.pw_uid, user.pw_gid)
    if blocked:
        return f"{user.pw_name} cannot execute this Python: {blocked} (use a Python outside /root)"
    return None
