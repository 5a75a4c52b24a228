"""Linux syscalls Python does not wrap, called through libc's syscall()
and prctl(): the numbers by machine, and the one rule for errors (an
OSError with the errno and the call's name).

The numbers are the kernel's for x86_64 and for aarch64 (the generic
table); seccomp.py builds its filter from this table, so it holds every
syscall that filter names as well as those called here (Landlock, keyctl,
the caller identity of callers.py).

    syscall("keyctl", ctypes.c_int(0), ctypes.c_int(-3), ctypes.c_int(0))
    prctl(PR_SET_NO_NEW_PRIVS, 1)

Arguments go to the kernel as the ctypes objects given (c_int, c_uint32,
c_size_t, pointers): the caller types them as the syscall declares them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from collections.abc import Callable

from .libc import libc

SYSCALLS = {
    "x86_64": {
        "keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272, "clone": 56, "clone3": 435,
        "setns": 308, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "pidfd_getfd": 438, "mount": 165, "umount2": 166, "pivot_root": 155,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "open_tree_attr": 467, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "open_by_handle_at": 304, "reboot": 169,
        "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179, "quotactl_fd": 443, "syslog": 103,
        "socket": 41, "seccomp": 317,
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
        "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240,
        "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
        "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
        "setgroups": 116, "setfsuid": 122, "setfsgid": 123, "capget": 125, "capset": 126,
    },
    "aarch64": {
        "keyctl": 219, "add_key": 217, "request_key": 218, "unshare": 97, "clone": 220, "clone3": 435,
        "setns": 268, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "pidfd_getfd": 438, "mount": 40, "umount2": 39, "pivot_root": 41,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "open_tree_attr": 467, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "open_by_handle_at": 265, "reboot": 142,
        "swapon": 224, "swapoff": 225, "acct": 89, "quotactl": 60, "quotactl_fd": 443, "syslog": 116,
        "socket": 198, "seccomp": 277,
        "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
        "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "mq_open": 180,
        "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185,
        "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
        "setgroups": 159, "setfsuid": 151, "setfsgid": 152, "capget": 90, "capset": 91,
    },
}

CAP_SETPCAP = 8    # capability(7) numbers
CAP_SETFCAP = 31

PR_SET_PDEATHSIG = 1
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4   # PR_CAP_AMBIENT's first argument
_PRCTL_NAMES = {PR_SET_PDEATHSIG: "PR_SET_PDEATHSIG", PR_CAPBSET_READ: "PR_CAPBSET_READ",
                PR_CAPBSET_DROP: "PR_CAPBSET_DROP", PR_SET_NO_NEW_PRIVS: "PR_SET_NO_NEW_PRIVS",
                PR_CAP_AMBIENT: "PR_CAP_AMBIENT"}


def machine() -> str:
    """This machine's name, a key of SYSCALLS where there is a table for it."""
    return platform.machine()


def _function(name: str, restype: type) -> Callable[..., int] | None:
    """libc's ``name`` as a function object of its own (the restype set here
    is no other caller's), or None where there is none."""
    lib = libc()
    if lib is None or platform.system() != "Linux":
        return None
    try:
        function = lib[name]
    except AttributeError:
        return None
    function.restype = restype
    return function


# Looked up now, before any fork: parent_death.die_with calls prctl between
# fork and exec, where looking a symbol up could wait for ever on a lock
# another thread of the parent held when it forked.
_SYSCALL = _function("syscall", ctypes.c_long)   # a long: setfsuid's ids and fds are not errors above 2**31
_PRCTL = _function("prctl", ctypes.c_int)
_NUMBERS = SYSCALLS.get(machine()) if _SYSCALL is not None else None


def syscall(name: str, *args: object) -> int:
    """The syscall ``name`` with ``args`` (ctypes objects); its result.
    OSError "name: strerror" with its errno when it fails; ENOSYS where
    there is no table for this machine (or no Linux)."""
    if _SYSCALL is None or _NUMBERS is None:
        raise OSError(errno.ENOSYS, f"{name}: syscalls are called here on Linux on {' and '.join(SYSCALLS)} only, "
                                    f"not on {platform.system()} {machine()}")
    result = _SYSCALL(ctypes.c_long(_NUMBERS[name]), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return result


def prctl(option: int, *args: int) -> int:
    """prctl(2) with ``args`` as unsigned longs (the rest 0); its result.
    OSError "prctl(PR_...): strerror" with its errno when it fails, ENOSYS
    where there is no prctl (not Linux)."""
    said = f"prctl({_PRCTL_NAMES.get(option, option)})"
    if _PRCTL is None:
        raise OSError(errno.ENOSYS, f"{said}: there is no prctl here (it is Linux's)")
    result = _PRCTL(ctypes.c_int(option), *(ctypes.c_ulong(a) for a in args), *(ctypes.c_ulong(0),) * (4 - len(args)))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{said}: {os.strerror(code)}")
    return result


def in_bounding_set(cap: int) -> bool:
    """Whether this process's capability bounding set holds ``cap`` (True
    where the kernel cannot tell: nothing is then refused for its lack)."""
    try:
        return bool(prctl(PR_CAPBSET_READ, cap))
    except OSError:
        return True
