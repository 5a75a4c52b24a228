"""A hostile python carton that answers its daemon as an attacker would:
its model code takes over the runner SDK's connection (the socket in the
frames that called it) and writes raw bytes to the daemon, as model code
in a runner can. Each request names one attack in x_string; a carton made
with ``health_attack`` answers its readiness probe that way at load.

Attacks, "what:arg":
- length:N   a 200 head claiming a body of N bytes, then one byte, then nothing
- chunks:_   a chunked 200 answer whose chunks never end
- eof:_      a 200 answer with no length, bytes until the daemon hangs up
- headers:N  a 200 answer with N header lines
- undeclared:_  a well-framed answer with an output the carton does not declare
- gzip:N     a well-framed answer, Content-Encoding gzip: N MiB of zeros in ~N KiB
- tiny:_     a chunked 200 answer in one-byte chunks, without end
- escaped:N  a well-framed answer of N million empty BYTES elements, its datatype spelled
             "BYT\\u0045S" (a JSON escape: BYTES to a parser, not to a byte search)
- stderr:N   N MiB of two-byte lines ("x") on stderr, then a normal answer
"""

from __future__ import annotations

from pathlib import Path

from kit.inferkit import echo_toml

# For a model's main.py: the runner's connection to the daemon, found in the
# frames that called the model, so the model can write to it as an attacker would.
TAKE_THE_CONNECTION = r'''
import socket
import sys


def connection():
    frame = sys._getframe(1)
    while frame is not None:
        conn = frame.f_locals.get("conn")
        if isinstance(conn, socket.socket):
            return conn
        frame = frame.f_back
    raise RuntimeError("no connection in the frames that called the model")
'''

HOSTILE_ANSWERS_MAIN = TAKE_THE_CONNECTION + r'''
import json
import os
import zlib

import numpy as np


def hold(conn):
    """Until the daemon hangs up (or 60 s)."""
    conn.settimeout(60)
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass


def framed(body, *headers):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
    return head + b"".join(h + b"\r\n" for h in headers) + b"Content-Length: %d\r\n\r\n" % len(body) + body


def take_over(order):
    what, _, arg = order.partition(":")
    conn = connection()
    try:
        if what == "length":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{" % int(arg))
            hold(conn)
        elif what == "chunks":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n" % (1 << 20) + b"A" * (1 << 20) + b"\r\n"
            while True:
                conn.sendall(chunk)
        elif what == "tiny":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunks = b"1\r\nA\r\n" * 65536
            while True:
                conn.sendall(chunks)
        elif what == "escaped":
            count = int(arg) * 1000000
            header = (b'{"model_name": "hostile", "outputs": [{"name": "y_string", "datatype": "BYT\\u0045S", '
                      b'"shape": [%d, 1], "parameters": {"binary_data_size": %d}}]}' % (count, 4 * count))
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nInference-Header-Content-Length: %d\r\n"
                         b"Content-Length: %d\r\n\r\n" % (len(header), len(header) + 4 * count) + header
                         + bytes(4 * count))
            hold(conn)
        elif what == "eof":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
            block = b"A" * (1 << 20)
            while True:
                conn.sendall(block)
        elif what == "headers":
            conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(int(arg)))
                         + b"Content-Length: 2\r\n\r\n{}")
            hold(conn)
        elif what == "undeclared":
            doc = {"model_name": "hostile", "outputs": [{"name": "not_declared", "datatype": "INT64", "shape": [1],
                                                         "data": [1]}]}
            conn.sendall(framed(json.dumps(doc).encode()))
            hold(conn)
        elif what == "gzip":
            bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
            zeros = bytes(1 << 20)
            body = b"".join(bomb.compress(zeros) for _ in range(int(arg))) + bomb.flush()
            conn.sendall(framed(body, b"Content-Encoding: gzip"))
            hold(conn)
    except OSError:
        pass   # the daemon hung up: what it does with such answers
    raise RuntimeError("the connection was taken over")


class HostileAnswers:
    def infer_with_tensors(self, tensors):
        order = tensors["x_string"].flat[0]
        order = order.decode() if isinstance(order, bytes) else str(order)
        what, _, arg = order.partition(":")
        if what == "stderr":
            block = b"x\n" * 32768
            for _ in range(int(arg) * 16):
                os.write(2, block)
            return {"y_string": np.array([[b"wrote"]], dtype=object)}
        take_over(order)


def get_model():
    attack = os.path.join(os.path.dirname(__file__), "health_attack.txt")
    if os.path.exists(attack):
        import cartonstore.runner.rest as rest
        order = open(attack).read().strip()
        rest._ready = lambda: take_over(order)
    return HostileAnswers()
'''


def hostile_answers_carton(dest: Path, *, health_attack: str | None = None) -> Path:
    """The carton; with ``health_attack`` ("length:N"...), its runner answers
    every readiness probe with that attack once the model is loaded."""
    (dest / "model").mkdir(parents=True, exist_ok=True)
    (dest / "carton.toml").write_text(echo_toml("hostile", ["string"]))   # the order in x_string
    (dest / "model" / "main.py").write_text(HOSTILE_ANSWERS_MAIN)
    if health_attack is not None:
        (dest / "model" / "health_attack.txt").write_text(health_attack)
    return dest
