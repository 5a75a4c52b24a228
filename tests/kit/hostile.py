"""A hostile python carton: each request names one escape to try, and the
answer says what happened ("ok: ..." when it got through, "denied: ..."
with the error when it did not). The escapes are the ones a carton's code
would try on a shared inference node."""

from __future__ import annotations

from pathlib import Path

from kit.inferkit import echo_toml

HOSTILE_MAIN = r'''
import ctypes
import errno
import os
import platform
import signal
import socket
import struct
import time

import numpy as np

# The kernel's own numbers, written out as an attacker would (not taken from the code under test).
SYSCALLS = {
    "x86_64": {"keyctl": 250, "add_key": 248, "unshare": 272, "clone": 56, "io_uring_setup": 425, "bpf": 321,
               "perf_event_open": 298, "userfaultfd": 323, "setns": 308, "mount": 165, "fsopen": 430,
               "open_tree": 428, "process_vm_readv": 310, "kexec_load": 246, "init_module": 175, "syslog": 103,
               "open_by_handle_at": 304, "pidfd_getfd": 438, "shmget": 29},
    "aarch64": {"keyctl": 219, "add_key": 217, "unshare": 97, "clone": 220, "io_uring_setup": 425, "bpf": 280,
                "perf_event_open": 241, "userfaultfd": 282, "setns": 268, "mount": 40, "fsopen": 430,
                "open_tree": 428, "process_vm_readv": 270, "kexec_load": 104, "init_module": 105, "syslog": 116,
                "open_by_handle_at": 265, "pidfd_getfd": 438, "shmget": 194},
}[platform.machine()]
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
KEYCTL_READ, KEY_SPEC_USER_KEYRING = 11, -4
LIBC = ctypes.PyDLL(None, use_errno=True)   # holding the GIL: a clone()d child needs it


def syscall(name, *args):
    result = LIBC.syscall(ctypes.c_long(SYSCALLS[name]), *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, "%s: %s" % (name, errno.errorcode.get(code, code)))
    return result


def interfaces():
    """The names of the network interfaces it sees, by an RTM_GETLINK dump over netlink."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)   # NETLINK_ROUTE
    s.settimeout(2)
    s.bind((0, 0))
    s.send(struct.pack("=IHHII", 32, 18, 0x301, 1, 0) + struct.pack("=BxHiII", 0, 0, 0, 0, 0))
    names = []
    while True:
        data = s.recv(65536)
        at = 0
        while at + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, at)
            if kind == 3 or length < 16:               # NLMSG_DONE
                s.close()
                return names
            if kind == 16:                             # RTM_NEWLINK: attributes after the ifinfomsg
                a = at + 32
                while a + 4 <= at + length:
                    rta_len, rta_type = struct.unpack_from("=HH", data, a)
                    if rta_len < 4:
                        break
                    if rta_type == 3:                  # IFLA_IFNAME
                        names.append(data[a + 4:a + rta_len].split(b"\0")[0].decode())
                    a += (rta_len + 3) & ~3
            at += (length + 3) & ~3


def attempt(order):
    what, _, arg = order.partition(":")
    if what == "chmod_write":          # rewrite a file of its own model (a hardlink to the store's blob)
        os.chmod(arg, 0o644)
        with open(arg, "r+b") as f:
            f.write(b"EVIL")
        return "rewrote " + arg
    if what == "write":                # append to any file (the index)
        with open(arg, "ab") as f:
            f.write(b"EVIL")
        return "wrote " + arg
    if what == "read":                 # another model's file, a secret
        with open(arg, "rb") as f:
            return "read %d bytes of %s" % (len(f.read()), arg)
    if what == "list":
        return "listed %s" % os.listdir(arg)[:5]
    if what == "tcp":                  # the daemon's TCP port, or any host
        host, port = arg.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()
        return "connected to " + arg
    if what == "unix":                 # the daemon's Unix socket
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(arg)
        s.close()
        return "connected to " + arg
    if what == "kill":                 # the daemon
        os.kill(int(arg), signal.SIGKILL)
        return "killed " + arg
    if what == "fork":                 # a fork bomb: children that sleep, then go
        born = 0
        try:
            for _ in range(int(arg)):
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                born += 1
        except OSError as e:
            raise OSError(e.errno, "fork %d failed after %d: %s" % (born + 1, born, e.strerror))
        return "forked %d" % born
    if what == "mem":                  # touch memory a GiB at a time, up to arg GiB
        held = []
        for _ in range(int(arg)):
            block = np.ones(1 << 30, dtype=np.uint8)
            held.append(block)
        return "touched %d GiB" % len(held)
    if what == "fds":                  # another process's open files (the daemon's, another runner's arena)
        return "opened %s" % os.listdir("/proc/%s/fd" % arg)[:5]
    if what == "memfds":               # the shared memory it was handed: its own model's arena, nothing else
        found = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink("/proc/self/fd/" + fd)
                if link.startswith("/memfd:"):
                    st = os.stat("/proc/self/fd/" + fd)
                    found[(st.st_dev, st.st_ino)] = link
            except OSError:            # the directory's own fd, closed since
                pass
        return "memfds %s" % sorted(found.values())   # one name per shared-memory object
    if what == "started":              # when this process started, seconds since the epoch (not an escape)
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        return "%f" % (time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + ticks / os.sysconf("SC_CLK_TCK"))
    if what == "stash":                # a private directory in its tmp, that its daemon may not enter
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "stash")
        os.makedirs(path + "/inner", mode=0o700, exist_ok=True)
        with open(path + "/inner/data", "wb") as f:
            f.write(b"x" * 4096)
        os.chmod(path, 0o700)
        return "stashed in " + path
    if what == "escape":               # a child in a session of its own, out of its process group's reach
        try:                           # first the fork bomb's children, dead and not yet reaped
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        return "escaped"
    if what == "keyctl_read":          # a key by its id: the daemon's session keyring holds one
        buf = ctypes.create_string_buffer(4096)
        got = syscall("keyctl", ctypes.c_int(KEYCTL_READ), ctypes.c_int(int(arg)), buf, ctypes.c_size_t(4096))
        return "read key %s: %r" % (arg, buf.raw[:got])
    if what == "add_key":              # a key in the runner user's keyring, which every runner shares
        key = syscall("add_key", b"user", b"cartonstore-hostile", arg.encode(), ctypes.c_size_t(len(arg)),
                      ctypes.c_int(KEY_SPEC_USER_KEYRING))
        return "added key %d" % key
    if what == "unshare_user":         # a user namespace, where it would hold every capability
        syscall("unshare", ctypes.c_ulong(CLONE_NEWUSER))
        return "in a user namespace of its own"
    if what == "clone_user":           # the same by clone(), a child in a new user namespace
        pid = syscall("clone", ctypes.c_ulong(CLONE_NEWUSER | SIGCHLD), None, None, None, None)
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        return "cloned %d into a user namespace" % pid
    if what == "io_uring":
        params = ctypes.create_string_buffer(120)
        fd = syscall("io_uring_setup", ctypes.c_uint(1), params)
        os.close(fd)
        return "an io_uring"
    if what == "syscall":              # any other, with zero arguments: the kernel would say EFAULT, EINVAL...
        return "%s returned %d" % (arg, syscall(arg, *[ctypes.c_long(0)] * 5))
    if what == "socket":               # family:type:protocol
        family, kind, proto = (int(n) for n in arg.split(":"))
        socket.socket(family, kind, proto).close()
        return "a socket " + arg
    if what == "udp":                  # a datagram to a host's port (a listener on the host's 127.0.0.1)
        host, port = arg.rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sent = s.sendto(b"hostile", (host, int(port)))
        s.close()
        return "sent %d bytes to %s" % (sent, arg)
    if what == "udp_bind":             # a UDP port on every address of the host
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", 0))
        port = s.getsockname()[1]
        s.close()
        return "bound UDP port %d" % port
    if what == "shmget":               # a SysV shared-memory segment by its key: the host's, or another runner's
        return "found segment %d" % syscall("shmget", ctypes.c_int(int(arg)), ctypes.c_size_t(0), ctypes.c_int(0))
    if what == "interfaces":
        return "interfaces %s" % interfaces()
    if what == "status":               # what the kernel says of its seccomp filter and capabilities
        return "; ".join(line.replace("\t", " ") for line in open("/proc/self/status").read().splitlines()
                         if line.startswith(("Seccomp:", "CapBnd:", "CapAmb:", "CapEff:", "NoNewPrivs:")))
    return "unknown order " + order


class Hostile:
    def infer_with_tensors(self, tensors):
        order = tensors["x_string"].flat[0]
        order = order.decode() if isinstance(order, bytes) else str(order)
        try:
            said = "ok: " + attempt(order)
        except BaseException as e:
            said = "denied: %s: %s" % (type(e).__name__, e)
        return {"y_string": np.array([[said.encode()]], dtype=object)}


def get_model():
    return Hostile()
'''

def hostile_carton(dest: Path) -> Path:
    (dest / "model").mkdir(parents=True, exist_ok=True)
    (dest / "carton.toml").write_text(echo_toml("hostile", ["string"]))   # the order in x_string, the answer in y_string
    (dest / "model" / "main.py").write_text(HOSTILE_MAIN)
    (dest / "model" / "weights.bin").write_bytes(b"\0" * 4096)
    return dest
