"""main() and serve(): load a model, listen on the Unix socket, stop
gracefully on SIGTERM (finish what is in flight, then exit 0).

The server (http_server.py, rest.py) is the standard library's sockets and
threads: nothing to import while the model loads (aiohttp, which runners
used before, took about 0.2 s)."""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from cartonstore.errors import CartonStoreError
from cartonstore.system.long_lived import settle_heap
from cartonstore.system.malloc_tuning import keep_big_buffers
from cartonstore.system.sockets import bind_unix, inherited_sockets

from .args import parse_runner_args
from .context import LoadError, Model, RunnerContext
from .http_server import HttpServer
from .lifecycle import describe_load_exception, die_with_parent, fail_load
from .model_channel import ChannelError, receive_model
from .protocol import ARENA_FD_ENV, ARENA_FD_NAME, MODEL_CHANNEL_ENV, WARM_DEVICES_ENV
from .rest import RunnerState, handle


def bind_unix_socket(path: Path) -> socket.socket:
    """The daemon's own binding (mode 0600, set before anyone can connect; a
    stale socket replaced, a live one or any other file refused), with its
    errors as load errors."""
    try:
        return bind_unix(path, mode=0o600)
    except CartonStoreError as e:
        raise LoadError(f"cannot listen on {path}: {e}") from None


def _serve(model: Model, ctx: RunnerContext, max_concurrency: int) -> None:
    state = RunnerState(model, ctx, max_concurrency)
    settle_heap()   # the model is loaded: before the socket answers, not during the first requests
    # A sandboxed runner is handed its socket, bound by the daemon (LISTEN_FDS,
    # as systemd passes them): it has no right to the directory it lives in.
    inherited = inherited_sockets()
    sock = inherited[0] if inherited else bind_unix_socket(ctx.socket_path)
    server = HttpServer(sock, functools.partial(handle, state))

    # from SIGTERM on, the server answers new requests 503 and the ones in flight are answered
    before = {sig: signal.signal(sig, lambda signum, frame: server.stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        print(f"cartonstore runner: model {ctx.name} version {ctx.version} ready on {ctx.socket_path} "
              f"(pid {os.getpid()})", file=sys.stderr, flush=True)
        server.serve()
        # the ones in flight finish and are answered before the connections close
        server.drain()
    finally:
        for sig, handler in before.items():   # serve() is public: its caller's handlers come back
            signal.signal(sig, handler)
    sock.close()
    if not inherited:   # a socket handed over is the daemon's to remove
        try:
            os.unlink(ctx.socket_path)
        except OSError:
            pass


def serve(model: Model, ctx: RunnerContext) -> None:
    """Serve ``model`` on ctx.socket_path until SIGTERM or SIGINT, then
    finish the requests in flight and return. A socket that cannot be
    bound (or bad serving opts) is a load failure: exit status 3."""
    try:
        max_concurrency = ctx.opt_int("max_concurrency", 1, minimum=1)
        assert max_concurrency is not None
        _serve(model, ctx, max_concurrency)
    except LoadError as exc:
        fail_load(str(exc))


def load_model(load: Callable[[RunnerContext], Model], ctx: RunnerContext) -> Model:
    """``load(ctx)``, or exit with status 3 and the reason on stderr."""
    try:
        model = load(ctx)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever the loader raised is the reason
        fail_load(describe_load_exception(exc))
    if not callable(getattr(model, "infer", None)):
        fail_load(f"the loader returned {type(model).__name__}, which has no infer(inputs, parameters) method")
    return model


def main(load: Callable[[RunnerContext], Model], argv: list[str] | None = None, *,
         warm: Callable[[list[str]], None] | None = None) -> None:
    """A runner's whole life: parse the standard argv, die with the parent,
    load (status 3 on failure), serve until SIGTERM, exit 0.

    ``warm(devices)`` imports what every load of this kind needs (a
    framework, a GPU context): a runner the daemon starts before its model's
    files are all there (model_channel.py) runs it while it waits."""
    die_with_parent()
    keep_big_buffers()
    prog = None if argv is not None else os.path.basename(sys.argv[0])
    if argv is None and (channel := os.environ.pop(MODEL_CHANNEL_ENV, None)) is not None:
        argv = await_model(channel, warm)
    try:
        ctx = parse_runner_args(argv, prog=prog)
    except LoadError as exc:
        fail_load(str(exc))
    model = load_model(load, ctx)
    serve(model, ctx)


def await_model(channel_fd: str, warm: Callable[[list[str]], None] | None) -> list[str] | None:
    """Warm up, then wait for the daemon's word (the model channel): the
    arguments to run with (None: this process's own). The tensor arena's fd,
    when passed, is named by ARENA_FD_ENV as if inherited."""
    devices = [d for d in os.environ.pop(WARM_DEVICES_ENV, "cpu").split(",") if d]
    if warm is not None:
        try:
            warm(devices)
        except Exception as exc:  # noqa: BLE001 - the load itself will fail and say why, if it must
            print(f"cartonstore runner: warming up failed ({type(exc).__name__}: {exc}); going on",
                  file=sys.stderr, flush=True)
    try:
        with socket.socket(fileno=int(channel_fd)) as channel:
            message = receive_model(channel)
    except (OSError, ValueError, ChannelError) as exc:
        fail_load(f"cannot read the daemon's model channel {channel_fd}: {exc}")
    if message is None:   # not wanted after all
        sys.stdout.flush()
        os._exit(0)
    for name, fd in message.fds.items():
        if name == ARENA_FD_NAME:
            os.environ[ARENA_FD_ENV] = str(fd)
        else:
            os.close(fd)
    return message.argv if message.argv is not None else sys.argv[1:]

