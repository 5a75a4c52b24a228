"""A seccomp filter for runners: the kernel's syscall interface cut down to
what model code needs, for the process that installs it and everything it
starts (it cannot be lifted).

Denied with EPERM: the kernel objects a sandbox would share (keyrings:
``keyctl``, ``add_key``, ``request_key``), new namespaces (``unshare`` and
``clone`` with a CLONE_NEW* flag, ``setns``: inside its own user namespace
a model could make raw sockets and nftables tables), the big attack surfaces
(``io_uring_*``, ``bpf``, ``perf_event_open``, ``userfaultfd``), other
processes' memory (``ptrace``, ``process_vm_*``, ``pidfd_getfd``), mounts
(the old and the new mount API), modules, kexec, ``reboot``, swap, ``acct``,
``quotactl``, ``syslog``, ``open_by_handle_at``. ``clone3`` answers ENOSYS,
as under Docker and systemd: its flags lie in memory a filter cannot read,
and glibc then falls back to ``clone``, whose flags it can.

SysV IPC and POSIX message queues are EPERM unless ``ipc`` (for a process
with an IPC namespace of its own: bubblewrap's). ``socket()`` is allowed
for AF_UNIX, for AF_INET and AF_INET6 where ``inet`` (but never of type
SOCK_RAW or SOCK_PACKET), and for AF_NETLINK with NETLINK_ROUTE where
``netlink_route``; every other family is EPERM.

A syscall of another architecture than the one the filter is built for
(i386's ``int 0x80`` from an x86_64 process), or of the x32 ABI, is EPERM:
its numbers are another table, which the filter does not check.

    install(build(machine(), inet=False, netlink_route=False, ipc=False))

``build`` is pure (a list of classic BPF instructions, numbered from
syscalls.py's table); ``install`` and ``unavailable`` talk to the kernel.
"""

from __future__ import annotations

import ctypes
import errno
import struct
from collections.abc import Sequence

from .syscalls import PR_SET_NO_NEW_PRIVS, SYSCALLS, machine, prctl, syscall

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

DENIED = ("keyctl", "add_key", "request_key", "setns", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "bpf", "perf_event_open", "userfaultfd", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
          "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
          "mount_setattr", "open_tree_attr", "kexec_load", "kexec_file_load", "init_module", "finit_module",
          "delete_module", "open_by_handle_at", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd",
          "syslog")
# SysV IPC and POSIX message queues: objects of the IPC namespace, found by key or guessed id. Shared with
# the host and every other runner where there is no IPC namespace of the runner's own (Landlock alone).
IPC = ("shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
       "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr")

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
NETLINK_ROUTE = 0
SOCK_TYPE_MASK, SOCK_RAW, SOCK_PACKET = 0xF, 3, 10
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET; unshare() also takes CLONE_NEWTIME,
# a bit that clone() reads as part of the exit signal.
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
CLONE_NEWTIME = 0x00000080

RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian here)
NR_OFFSET, ARCH_OFFSET, ARGS_OFFSET = 0, 4, 16

# classic BPF opcodes
LD_ABS = 0x20      # BPF_LD | BPF_W | BPF_ABS
AND_K = 0x54       # BPF_ALU | BPF_AND | BPF_K
JEQ_K = 0x15       # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35       # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45      # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06       # BPF_RET | BPF_K

Instruction = tuple[int, int, int, int]   # (code, jt, jf, k), as struct sock_filter


def _arg(n: int) -> int:
    """Where argument n's low 32 bits are (the kernel reads these syscalls' arguments as int)."""
    return ARGS_OFFSET + 8 * n


def build(arch: str, *, inet: bool, netlink_route: bool, ipc: bool) -> list[Instruction]:
    """The filter for ``arch`` (a key of SYSCALLS), as instructions, with
    SysV IPC and POSIX message queues where ``ipc``; ValueError for an
    architecture it does not know."""
    if arch not in SYSCALLS:
        raise ValueError(f"no seccomp filter for {arch!r} here (only {', '.join(SYSCALLS)})")
    nr = SYSCALLS[arch]
    lines: list = [(LD_ABS, None, None, ARCH_OFFSET), (JEQ_K, None, "deny", AUDIT_ARCH[arch]),
                   (LD_ABS, None, None, NR_OFFSET)]
    if arch == "x86_64":
        lines.append((JGE_K, "deny", None, X32_SYSCALL_BIT))
    lines += [(JEQ_K, "enosys", None, nr["clone3"]), (JEQ_K, "socket", None, nr["socket"]),
              (JEQ_K, "clone", None, nr["clone"]), (JEQ_K, "unshare", None, nr["unshare"])]
    lines += [(JEQ_K, "deny", None, nr[name]) for name in (*DENIED, *(() if ipc else IPC))]
    lines += [(RET_K, None, None, RET_ALLOW), "socket", (LD_ABS, None, None, _arg(0)),
              (JEQ_K, "allow", None, AF_UNIX)]
    if inet:
        lines += [(JEQ_K, "inet", None, AF_INET), (JEQ_K, "inet", None, AF_INET6)]
    if netlink_route:
        lines.append((JEQ_K, "netlink", None, AF_NETLINK))
    lines.append((RET_K, None, None, RET_ERRNO | errno.EPERM))
    if inet:
        lines += ["inet", (LD_ABS, None, None, _arg(1)), (AND_K, None, None, SOCK_TYPE_MASK),
                  (JEQ_K, "deny", None, SOCK_RAW), (JEQ_K, "deny", "allow", SOCK_PACKET)]
    if netlink_route:
        lines += ["netlink", (LD_ABS, None, None, _arg(2)), (JEQ_K, "allow", "deny", NETLINK_ROUTE)]
    lines += ["clone", (LD_ABS, None, None, _arg(0)), (JSET_K, "deny", "allow", CLONE_NEW),
              "unshare", (LD_ABS, None, None, _arg(0)), (JSET_K, "deny", "allow", CLONE_NEW | CLONE_NEWTIME),
              "allow", (RET_K, None, None, RET_ALLOW),
              "deny", (RET_K, None, None, RET_ERRNO | errno.EPERM),
              "enosys", (RET_K, None, None, RET_ERRNO | errno.ENOSYS)]
    return _assemble(lines)


def _assemble(lines: list) -> list[Instruction]:
    """Labels (strings) resolved to the relative jumps of classic BPF."""
    at: dict[str, int] = {}
    program: list[tuple] = []
    for line in lines:
        if isinstance(line, str):
            at[line] = len(program)
        else:
            program.append(line)

    def offset(i: int, target: str | None) -> int:
        if target is None:
            return 0
        jump = at[target] - i - 1
        if not 0 <= jump <= 255:
            raise ValueError(f"a jump to {target} of {jump} does not fit classic BPF")
        return jump
    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(program)]


def encode(program: Sequence[Instruction]) -> bytes:
    """As an array of struct sock_filter."""
    return b"".join(struct.pack("=HBBI", *ins) for ins in program)


SECCOMP_SET_MODE_FILTER, SECCOMP_GET_ACTION_AVAIL = 1, 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def unavailable() -> str | None:
    """Why this process could not install the filter, or None when it can."""
    if machine() not in SYSCALLS:
        return f"no seccomp filter is built for {machine()} here (only {', '.join(SYSCALLS)})"
    try:
        syscall("seccomp", ctypes.c_uint(SECCOMP_GET_ACTION_AVAIL), ctypes.c_uint(0),
                ctypes.byref(ctypes.c_uint32(RET_ERRNO)))
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EINVAL):
            return f"this kernel filters no syscalls ({e.strerror})"
        return f"seccomp is not to be had here ({e.strerror})"
    return None


def install(program: Sequence[Instruction]) -> None:
    """Filter this process's syscalls (and its children's, and whatever it
    execs) through ``program``, for good; OSError when the kernel refuses."""
    code = encode(program)
    prctl(PR_SET_NO_NEW_PRIVS, 1)   # what lets a process without CAP_SYS_ADMIN install a filter
    fprog = _SockFprog(len(program), code)
    syscall("seccomp", ctypes.c_uint(SECCOMP_SET_MODE_FILTER), ctypes.c_uint(0), ctypes.byref(fprog))
