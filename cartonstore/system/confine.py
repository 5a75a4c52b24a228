"""The last step before a runner's own program: ``python -I -m
cartonstore.system.confine PLAN -- ARGV...`` applies PLAN to itself, then
execs ARGV, which inherits every restriction.

PLAN (JSON) may say, each applied in this order:

- ``userns``: {"uid": [ids], "gid": [ids]}: enter a new user namespace in
  which each of those ids is itself and no other id exists, as its root
  (a root launcher before bubblewrap: bubblewrap then mounts with root's
  rights over root's own files, a parent directory's 0700 included, and a
  second launcher inside drops to the runner's uid, which the namespace
  maps). The maps are written by a child left outside, which writing more
  than its own id takes (CAP_SETUID, CAP_SETGID there);
- ``rlimits``: {"NPROC": n, "DATA": bytes, ...}, resource.RLIMIT_* names;
- ``drop_caps``: empty the bounding capability set (while still root: it
  takes CAP_SETPCAP; a launcher that is not root, under bubblewrap, finds
  it empty or fails) and the ambient set, so nothing it execs regains one;
  after ``user``, the inheritable set too;
- ``user``: [uid, gid]: drop to them, with no supplementary groups (the
  daemon runs as root; the runner never does);
- ``parent``: the daemon's pid, to die with (a change of uid clears the
  parent-death signal the daemon armed);
- ``listen_fd``: an inherited listening socket, handed to ARGV as fd 3 with
  LISTEN_FDS=1 and LISTEN_PID (systemd's socket activation: the runner gets
  its socket without any right to the directory it lives in); an fd that
  ``fd_env``'s variables name (the tensor arena's) is moved out of its way;
- ``chdir``: the working directory;
- ``keyring``: a new anonymous session keyring (system/keyring.py), the
  runner user's, in place of the daemon's;
- ``landlock``: system/landlock.py's Granted, as a JSON object;
- ``seccomp``: {"inet": bool, "netlink_route": bool, "ipc": bool},
  system/seccomp.py's filter for this machine, last (it denies keyctl).

Whatever cannot be applied ends this process with status 3 and the reason
as its one stderr line (what a runner that cannot load does: the runner
contract's EXIT_LOAD_FAILED, in cartonstore.runner.protocol, a layer this
one may not import), never by running ARGV less confined than planned.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import sys

from . import seccomp
from .keyring import join_new_session
from .landlock import Granted, LandlockError, restrict
from .parent_death import die_with
from .sockets import SD_LISTEN_FDS_START
from .syscalls import (
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAPBSET_DROP,
    PR_CAPBSET_READ,
    machine,
    prctl,
    syscall,
)

CLONE_NEWUSER = 0x10000000
_CAP_VERSION_3 = 0x20080522


def enter_user_namespace(uids: list[int], gids: list[int]) -> None:
    """unshare(CLONE_NEWUSER), each of ``uids`` and ``gids`` mapped to
    itself, by a child that stays outside to write the maps; OSError saying
    which step failed."""
    ready, go = os.pipe()
    child = os.fork()
    if child == 0:   # outside the namespace: it writes the parent's maps once the parent is in it
        code = 255
        try:
            os.close(go)
            if os.read(ready, 1) == b"1":
                for name, ids in (("uid_map", uids), ("gid_map", gids)):
                    fd = os.open(f"/proc/{os.getppid()}/{name}", os.O_WRONLY)
                    try:
                        os.write(fd, "".join(f"{i} {i} 1\n" for i in ids).encode())   # one write: the kernel's rule
                    finally:
                        os.close(fd)
                code = 0
        except OSError as e:
            code = e.errno or 255
        os._exit(code)
    os.close(ready)
    entered = False
    try:
        syscall("unshare", ctypes.c_int(CLONE_NEWUSER))
        entered = True
    finally:
        os.write(go, b"1" if entered else b"0")
        os.close(go)
        _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise OSError(code, f"cannot map ids {uids} and groups {gids} into a new user namespace: "
                            f"{os.strerror(code) if code != 255 else 'the mapping child failed'}")


def clear_inheritable() -> None:
    """Empty the inheritable capability set (what bubblewrap's --cap-add
    leaves there): lowering it takes no capability."""
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()   # two {effective, permitted, inheritable}
    syscall("capget", header, data)
    data[2] = data[5] = 0
    syscall("capset", header, data)


def empty_capabilities() -> None:
    """Drop every capability from the bounding set (one by one, up to the
    kernel's last, where PR_CAPBSET_READ fails with EINVAL) and clear the
    ambient set; OSError naming the first that stays."""
    cap = 0
    while True:
        try:
            held = prctl(PR_CAPBSET_READ, cap)
        except OSError as e:
            if cap == 0:
                raise OSError(e.errno,
                              f"cannot read the bounding capability set: {os.strerror(e.errno or 0)}") from None
            break
        if held:
            try:
                prctl(PR_CAPBSET_DROP, cap)
            except OSError as e:
                raise OSError(e.errno,
                              f"capability {cap} stays in the bounding set: {os.strerror(e.errno or 0)}") from None
        cap += 1
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError as e:
        if e.errno != errno.EINVAL:   # a kernel before 4.3 has no ambient set
            raise OSError(e.errno, f"cannot clear the ambient capabilities: {os.strerror(e.errno or 0)}") from None


def apply(plan: dict) -> list[str]:
    """Apply ``plan`` to this process; what holds, in words."""
    if not isinstance(plan, dict):
        raise ValueError(f"a plan is a JSON object, not {type(plan).__name__}")
    held: list[str] = []
    if (userns := plan.get("userns")) is not None:
        enter_user_namespace([int(i) for i in userns["uid"]], [int(i) for i in userns["gid"]])
        held.append("userns")
    for name, limit in (plan.get("rlimits") or {}).items():
        which = getattr(resource, f"RLIMIT_{name}", None)
        if which is None:
            raise ValueError(f"no resource limit RLIMIT_{name} here")
        hard = resource.getrlimit(which)[1]
        limit = int(limit) if hard == resource.RLIM_INFINITY else min(int(limit), hard)   # lowering only
        resource.setrlimit(which, (limit, limit))
        held.append(f"rlimit:{name.lower()}")
    if plan.get("drop_caps"):
        empty_capabilities()
        held.append("caps:none")
    if plan.get("user"):
        uid, gid = plan["user"]
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if plan.get("drop_caps"):
            clear_inheritable()
        held.append(f"uid:{uid}")
    if plan.get("parent"):
        die_with(int(plan["parent"]))
    if plan.get("listen_fd") is not None:
        fd = int(plan["listen_fd"])
        for name in plan.get("fd_env") or ():   # an fd another variable names must not be overwritten
            if os.environ.get(name) == str(SD_LISTEN_FDS_START) and fd != SD_LISTEN_FDS_START:
                moved = os.dup(SD_LISTEN_FDS_START)
                os.set_inheritable(moved, True)
                os.environ[name] = str(moved)
        if fd != SD_LISTEN_FDS_START:
            os.dup2(fd, SD_LISTEN_FDS_START)
            os.close(fd)
        os.set_inheritable(SD_LISTEN_FDS_START, True)
        os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
    if plan.get("chdir"):
        os.chdir(plan["chdir"])
    if plan.get("keyring"):
        join_new_session()
        held.append("keyring")
    if plan.get("landlock") is not None:
        granted = plan["landlock"]
        got = restrict(Granted(
            read=tuple(granted.get("read", ())), write=tuple(granted.get("write", ())),
            devices=tuple(granted.get("devices", ())), deny_tcp=bool(granted.get("deny_tcp", True)),
            scope=bool(granted.get("scope", True))))
        if missing := set(granted.get("require", ())) - set(got):
            raise LandlockError(95, f"Landlock did not take hold of {', '.join(sorted(missing))}")
        held += [f"landlock:{what}" for what in got]
    if (sockets := plan.get("seccomp")) is not None:
        seccomp.install(seccomp.build(machine(), inet=bool(sockets["inet"]),
                                      netlink_route=bool(sockets["netlink_route"]), ipc=bool(sockets["ipc"])))
        held.append("seccomp")
    return held


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        print("cartonstore sandbox: usage: python -m cartonstore.system.confine PLAN -- ARGV...", file=sys.stderr)
        sys.exit(2)
    try:
        held = apply(json.loads(argv[0]))
        # What took hold, as the kernel answered (the daemon's index says what was planned).
        print(f"cartonstore sandbox: {', '.join(held) or 'nothing'} held", file=sys.stderr, flush=True)
    except (OSError, LandlockError, ValueError, KeyError, TypeError) as e:
        print(f"cartonstore sandbox: cannot confine the runner: {e}", file=sys.stderr, flush=True)
        sys.exit(3)
    program = argv[2:]
    try:
        os.execvp(program[0], program)
    except OSError as e:
        print(f"cartonstore sandbox: cannot run {program[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
        sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1:])
