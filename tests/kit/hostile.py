"""A hostile python carton: each request names one escape to try, and the
answer says what happened ("ok: ..." when it got through, "denied: ..."
with the error when it did not). The escapes are the ones a carton's code
would try on a shared inference node."""

from __future__ import annotations

from pathlib import Path

from kit.inferkit import echo_toml

HOSTILE_MAIN = r'''
import os
import signal
import socket
import time

import numpy as np


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
