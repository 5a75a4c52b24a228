"""The runners' seccomp filter (system/seccomp.py): the program, run by a
classic BPF interpreter here for both architectures it is built for, and
installed for real in a child process (system/confine.py's launcher),
under which Python, numpy, onnxruntime and torch still work."""

from __future__ import annotations

import errno
import json
import struct
import subprocess
import sys

import pytest

from cartonstore.system import seccomp
from cartonstore.system.seccomp import AUDIT_ARCH, DENIED, IPC, RET_ALLOW, RET_ERRNO, build
from cartonstore.system.syscalls import SYSCALLS, machine

EPERM, ENOSYS = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
AUDIT_ARCH_I386 = 0x40000003
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK = 1, 2, 10, 16, 17, 40
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, SOCK_PACKET, SOCK_NONBLOCK, SOCK_CLOEXEC = 1, 2, 3, 10, 0o4000, 0o2000000
NETLINK_ROUTE, NETLINK_NETFILTER, NETLINK_AUDIT = 0, 12, 9
CLONE_THREAD_FLAGS = 0x003D0F00   # what pthread_create asks: VM, FS, FILES, SIGHAND, THREAD, SYSVSEM, SETTLS, ...
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWTIME, CLONE_FILES = 0x10000000, 0x40000000, 0x20000, 0x80, 0x400
READ = {"x86_64": 0, "aarch64": 63}


def run(program: list[tuple[int, int, int, int]], nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's classic BPF would return for this syscall (the
    opcodes the builder uses; any other fails the test)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    a, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        pc += 1
        if code == 0x20:
            a = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:
            a &= k
        elif code in (0x15, 0x35, 0x45):
            taken = a == k if code == 0x15 else a >= k if code == 0x35 else bool(a & k)
            pc += jt if taken else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"opcode {code:#x} at {pc - 1}")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_every_denied_syscall_is_eperm_clone3_enosys_and_the_rest_allowed(arch: str) -> None:
    program, native, nr = build(arch, inet=True, netlink_route=True, ipc=True), AUDIT_ARCH[arch], SYSCALLS[arch]
    for name in DENIED:
        assert run(program, nr[name], native) == EPERM, name
    assert run(program, nr["clone3"], native) == ENOSYS
    for allowed in range(460):
        if allowed not in {nr[n] for n in (*DENIED, "clone3", "socket", "clone", "unshare")}:
            assert run(program, allowed, native) == RET_ALLOW, allowed
    without_ipc = build(arch, inet=True, netlink_route=True, ipc=False)
    for name in IPC:
        assert run(program, nr[name], native) == RET_ALLOW and run(without_ipc, nr[name], native) == EPERM, name
    assert run(program, READ[arch], AUDIT_ARCH_I386) == EPERM          # another table's numbers: refused
    if arch == "x86_64":
        assert run(program, 0x40000000 | READ[arch], native) == EPERM    # the x32 ABI


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_namespaces_are_refused_by_any_flag_and_threads_and_forks_allowed(arch: str) -> None:
    program, native, nr = build(arch, inet=False, netlink_route=False, ipc=False), AUDIT_ARCH[arch], SYSCALLS[arch]
    assert run(program, nr["clone"], native, (CLONE_THREAD_FLAGS,)) == RET_ALLOW
    assert run(program, nr["clone"], native, (17,)) == RET_ALLOW                 # fork: SIGCHLD
    for flag in (CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS):
        assert run(program, nr["clone"], native, (flag | 17,)) == EPERM
        assert run(program, nr["unshare"], native, (flag,)) == EPERM
    assert run(program, nr["unshare"], native, (CLONE_NEWTIME,)) == EPERM
    assert run(program, nr["clone"], native, (CLONE_NEWTIME | 17,)) == RET_ALLOW   # clone() reads 0x80 as a signal
    assert run(program, nr["unshare"], native, (CLONE_FILES,)) == RET_ALLOW


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
@pytest.mark.parametrize(("inet", "netlink_route"), [(False, False), (True, False), (True, True)])
def test_sockets_are_the_families_asked_for_never_raw_or_packet(arch: str, inet: bool, netlink_route: bool) -> None:
    program, native = build(arch, inet=inet, netlink_route=netlink_route, ipc=False), AUDIT_ARCH[arch]
    socket_nr = SYSCALLS[arch]["socket"]

    def socket(family: int, kind: int, proto: int = 0) -> int:
        return run(program, socket_nr, native, (family, kind, proto))
    flags = SOCK_NONBLOCK | SOCK_CLOEXEC
    assert socket(AF_UNIX, SOCK_STREAM | flags) == socket(AF_UNIX, SOCK_DGRAM) == RET_ALLOW
    for family in (AF_INET, AF_INET6):
        assert socket(family, SOCK_STREAM) == socket(family, SOCK_DGRAM | flags) == (RET_ALLOW if inet else EPERM)
        assert socket(family, SOCK_RAW, 1) == socket(family, SOCK_RAW | flags, 1) == EPERM
        assert socket(family, SOCK_PACKET) == EPERM
    assert socket(AF_NETLINK, SOCK_RAW | flags, NETLINK_ROUTE) == (RET_ALLOW if netlink_route else EPERM)
    assert socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER) == socket(AF_NETLINK, SOCK_DGRAM, NETLINK_AUDIT) == EPERM
    assert socket(AF_PACKET, SOCK_RAW) == socket(AF_PACKET, SOCK_DGRAM) == socket(AF_VSOCK, SOCK_STREAM) == EPERM
    # The kernel reads these arguments as int: bits above 32 change nothing.
    assert run(program, socket_nr, native, ((1 << 32) | AF_PACKET, SOCK_RAW, 0)) == EPERM


def test_an_architecture_it_has_no_table_for_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no seccomp filter for 'riscv64'"):
        build("riscv64", inet=False, netlink_route=False, ipc=False)


PROBE = r'''
import ctypes, errno, json, os, socket, subprocess, threading
lib = ctypes.CDLL(None, use_errno=True)
NR = json.loads(os.environ["PROBE_NR"])
def call(name, *args):
    return "ok" if lib.syscall(ctypes.c_long(NR[name]), *args) >= 0 else errno.errorcode[ctypes.get_errno()]
def sock(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
said = {"keyctl": call("keyctl", 0, -3, 0), "unshare": call("unshare", ctypes.c_ulong(0x10000000)),
        "io_uring_setup": call("io_uring_setup", 1, ctypes.create_string_buffer(120)),
        "clone3": call("clone3", None, 0), "unix": sock(1, 1), "udp": sock(2, 2), "raw": sock(2, 3, 1),
        "netlink": sock(16, 3, 0), "shmget": call("shmget", 0x63617274, 0, 0)}
t = threading.Thread(target=lambda: None)
t.start()
t.join()
said["thread"] = "ok"
said["fork"] = "ok" if subprocess.run(["true"]).returncode == 0 else "failed"
said["status"] = {k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
                  if k in ("Seccomp", "NoNewPrivs")}
print(json.dumps(said))
'''


def confined(plan: dict, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-m", "cartonstore.system.confine", json.dumps(plan), "--",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("inet", [False, True])
def test_a_child_under_the_filter_is_refused_what_it_denies_and_keeps_threads_and_forks(inet: bool) -> None:
    if (why := seccomp.unavailable()) is not None:
        pytest.skip(why)
    p = confined({"seccomp": {"inet": inet, "netlink_route": False, "ipc": False}}, PROBE,
                 env={"PROBE_NR": json.dumps(SYSCALLS[machine()]), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and "seccomp held" in p.stderr, p.stderr
    said = json.loads(p.stdout)
    assert said == {"keyctl": "EPERM", "unshare": "EPERM", "io_uring_setup": "EPERM", "clone3": "ENOSYS",
                    "unix": "ok", "udp": "ok" if inet else "EPERM", "raw": "EPERM", "netlink": "EPERM",
                    "shmget": "EPERM", "thread": "ok", "fork": "ok", "status": {"Seccomp": "2", "NoNewPrivs": "1"}}, said


FRAMEWORKS = r'''
import sys, threading
import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper
graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"])], "sq",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
y = session.run(None, {"x": np.array([2.0, 3.0], dtype=np.float32)})[0]
torch.set_num_threads(2)
scripted = torch.jit.script(torch.nn.Linear(64, 64))
z = scripted(torch.ones(256, 64)).sum().item()
print(y.tolist(), np.linalg.inv(np.eye(3) * 2).trace(), z == z)
'''


@pytest.mark.slow
def test_numpy_onnxruntime_and_torch_work_under_the_strictest_filter() -> None:
    """The filter Landlock-alone runners get (AF_UNIX only): the frameworks
    import, start their thread pools and compute."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    if (why := seccomp.unavailable()) is not None:
        pytest.skip(why)
    p = confined({"seccomp": {"inet": False, "netlink_route": False, "ipc": False}}, FRAMEWORKS)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["[4.0,", "9.0]", "1.5", "True"], p.stdout + p.stderr
