"""The ``cartonstore`` command: a thin layer over cartonstore.store.Store.

Each command opens the store, calls one library method and prints the
result. Library exceptions become one line on stderr and an exit status
chosen by their category (cartonstore.errors.CATEGORIES); nothing else is caught.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from cartonstore.errors import (
    CartonStoreError,
    IntegrityError,
    InvalidCarton,
    InvalidInput,
    NotFound,
    PermissionDenied,
    exit_code_for,
)
from cartonstore.format.units import format_size, parse_size
from cartonstore.system.file_access import explained

from . import parser as cli_parser
from .adopt_command import cmd_adopt
from .args import arrange_argv
from .daemon_commands import cmd_csi, cmd_gc, cmd_load, cmd_serve, cmd_unload
from .output import Output, print_json
from .pack_command import cmd_pack, model_file_hint
from .progress import Progress

T = TypeVar("T")

if TYPE_CHECKING:
    from cartonstore.client.infer import InferClient
    from cartonstore.config.load import Config
    from cartonstore.fetch.puller import Puller
    from cartonstore.store import Store


# -- commands ------------------------------------------------------------------


def load_settings(args: argparse.Namespace) -> Config:
    """The settings file (--config or $CARTONSTORE_CONFIG), the environment,
    then this command's flags, each overriding the one before."""
    from cartonstore.config.load import load_config  # imported here, as Store in main: --help needs neither

    overrides = {
        "store.root": args.root,
        "server.socket": getattr(args, "socket", None),
        "server.listen": getattr(args, "listen", None),
        "server.grpc_listen": getattr(args, "grpc_listen", None),
        "mirror.listen": getattr(args, "mirror_listen", None),
        "server.log_format": getattr(args, "log_format", None),
        "server.log_level": getattr(args, "log_level", None),
        "fetch.mirrors": getattr(args, "mirror", None),
        "fetch.allow_hosts": getattr(args, "allow_host", None),
        "fetch.deny_hosts": getattr(args, "deny_host", None),
    }
    return load_config(args.config, overrides=overrides)


def with_puller(store: Store, args: argparse.Namespace, work: Callable[[Puller], Awaitable[T]]) -> T:
    """Run ``work(puller)`` on an event loop with progress shown as asked."""
    # Imported here: commands that never fetch (path of a built model, ls,
    # inspect) must not pay for asyncio and aiohttp.
    import asyncio

    from cartonstore.config.pulling import standard_puller

    progress = Progress(args.progress)

    async def run() -> T:
        async with standard_puller(store, args.settings.fetch_config(), on_event=progress.event) as p:
            progress.watch(p.stats)
            try:
                return await work(p)
            finally:
                progress.close({"requests": p.stats.requests})

    return asyncio.run(run())


def cmd_add(store: Store, args: argparse.Namespace, out: Output) -> None:
    source = args.source
    if args.include or args.exclude:
        from cartonstore.hf import with_patterns

        source = with_patterns(source, args.include, args.exclude)
    try:
        r = with_puller(store, args, lambda p: p.add(source, name=args.name, lazy=args.lazy, force=args.force))
    except InvalidCarton as e:
        raise model_file_hint(args.source, e) or e from None
    data = {"manifest_sha256": r.digest, "name": r.name, "complete": r.complete,
            "naming": r.naming.as_json() if r.naming else {"name": r.name, "moved_from": None, "kept_by": None},
            **r.counts()}
    state = "complete" if r.complete else "known (blobs not fetched yet)"
    out.emit(data, [f"added {args.source}: {state}; {r.summary()}", r.digest])


def cmd_push(store: Store, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.oci.push import push_carton

    r = with_puller(store, args, lambda p: push_carton(p, args.ref, args.target, args.format))
    out.emit(r.as_json(), [r.summary(), r.reference])


def cmd_infer(store: Store, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.client.infer import InferClient, describe_outputs, outputs_as_json, parse_input_arg
    from cartonstore.client.wire import DaemonUnavailable  # not leases.py: asyncio is not needed to catch it

    client = InferClient(args.settings.socket_path)
    loaded: dict[str, bool] = {}
    try:
        with loaded_for_this_command(client, args, loaded):
            meta = client.metadata(args.ref)
            datatypes = {t["name"]: t["datatype"] for t in meta.get("inputs", [])}
            inputs = dict(parse_input_arg(text, datatypes) for text in args.input)
            outputs = client.infer(args.ref, inputs)
    except DaemonUnavailable:
        from cartonstore.format.dtypes import carton_dtype_to_v2

        from .local_infer import infer_locally

        cfg = store.config_of(store.resolve_or_add(args.ref))
        datatypes = {t.name: carton_dtype_to_v2(t.dtype) for t in cfg.inputs or ()}
        inputs = dict(parse_input_arg(text, datatypes) for text in args.input)
        outputs = infer_locally(store, args.settings, args.ref, inputs)
    if out.as_json:
        print_json({"outputs": outputs_as_json(outputs), **loaded})
    else:
        print("\n".join(describe_outputs(outputs)))


SELFTEST_FAILED = 8   # `selftest`: the model ran, and failed a test


def cmd_selftest(store: Store, args: argparse.Namespace, out: Output) -> int:
    from cartonstore.client.infer import InferClient
    from cartonstore.client.wire import DaemonUnavailable  # not leases.py: asyncio is not needed to catch it

    client = InferClient(args.settings.socket_path)
    loaded: dict[str, bool] = {}
    try:
        try:
            with loaded_for_this_command(client, args, loaded):
                # no tolerance given: the daemon's for the model's device (selftest_rtol[_cuda])
                report = client.selftest(args.ref, rtol=args.rtol, atol=args.atol)
        except InvalidInput as e:   # the daemon ran them on load (runners.selftest_on_load) and they failed
            if "self-test failed" not in e.message:
                raise
            print(f"cartonstore selftest: {e.message}", file=sys.stderr)
            return SELFTEST_FAILED
    except DaemonUnavailable:
        from .local_infer import selftest_locally

        report = selftest_locally(store, args.settings, args.ref, args.rtol, args.atol).as_json()
    lines = [f"{t['outcome'].upper().replace('PASSED', 'PASS').replace('FAILED', 'FAIL')} {t['name']}"
             + (f": {t['error']}" if "error" in t else "")
             + "".join(f"\n  {m['problem']}" for m in t.get("mismatches", [])) for t in report["tests"]]
    out.emit({**report, **loaded}, [*lines, report["summary"]])
    return 0 if report["passed"] else SELFTEST_FAILED


@contextmanager
def loaded_for_this_command(client: InferClient, args: argparse.Namespace, said: dict[str, bool]) -> Iterator[None]:
    """Load args.ref into the daemon unless it is ready, saying so on
    stderr (and in ``said``, for --json); with --unload-after, unload what
    was loaded here once the work is done, whatever happened. A daemon
    still loading again what it had loaded before a restart is waited
    for: a model it brings back is not this command's to load or unload."""
    import time

    deadline = time.monotonic() + 120
    while not client.server_ready() and time.monotonic() < deadline:
        time.sleep(0.1)
    if client.is_ready(args.ref):
        yield
        return
    client.load(args.ref)
    said["loaded_into_daemon"] = True
    if args.unload_after:
        print(f"cartonstore {args.command}: loaded {args.ref} into the daemon; unloading it after", file=sys.stderr)
    else:
        print(f"cartonstore {args.command}: loaded {args.ref} into the daemon, where it stays loaded "
              f"(--unload-after unloads what this command loads)", file=sys.stderr)
    try:
        yield
    finally:
        if args.unload_after:
            client.unload(args.ref)
            said["unloaded_after"] = True


def already_materialized(store: Store, args: argparse.Namespace) -> Path | None:
    """`path` of a carton that is complete and built needs no network: answered
    here without an event loop or HTTP client, as the puller would answer it
    (Store.materialized), progress closed as with_puller closes it. None when
    REF needs the puller: not resolvable (a URL or a local path to add, or an
    error it reports), blobs missing, or no model directory yet."""
    try:
        digest = store.resolve(args.ref)
    except CartonStoreError:
        return None
    progress = Progress(args.progress)
    nothing_moved = {"requests": 0, "retries": 0}
    try:
        path = store.materialized(digest)
    except BaseException:
        progress.close(nothing_moved)
        raise
    if path is not None:
        progress.close(nothing_moved)
    return path


def cmd_path(store: Store, args: argparse.Namespace, out: Output) -> None:
    path = already_materialized(store, args)
    if path is None and store.read_only:   # fetching, adding or building changes the store
        if not os.path.exists(args.ref):
            store.resolve(args.ref)   # a REF that names nothing is not found, whoever asks
        raise store.index.write_refused(f"building {args.ref} (not materialized yet)")
    try:
        path = path or with_puller(store, args, lambda p: p.materialize(args.ref))
    except NotFound as e:   # REF resolved to nothing: a path that is not there says so
        from cartonstore.store.store import no_such_source

        missing = no_such_source(args.ref) if e.subject == args.ref and not os.path.exists(args.ref) else None
        raise (missing or e) from None
    out.emit({"manifest_sha256": path.name, "path": str(path)}, [str(path)])


def cmd_ls(store: Store, args: argparse.Namespace, out: Output) -> None:
    if args.sources:
        return ls_sources(store, out)
    infos = store.list()
    rows: list[dict[str, Any]] = [{"manifest_sha256": i.row.digest, "names": i.names, "model_name": i.row.model_name,
             "runner": i.row.runner_name, "files": i.row.file_count, "size": i.row.total_size,
             "complete": i.complete, "path": str(i.model_dir) if i.model_dir else None} for i in infos]
    lines = [f"{r['manifest_sha256'][:16]}  {'complete' if r['complete'] else 'partial ':8}  "
             f"{format_size(r['size']) if r['size'] is not None else '?':>10}  {','.join(r['names']) or '-'}"
             for r in rows]
    if out.as_json:
        print_json(rows)
    else:
        print("\n".join(lines) if lines else "(the store holds no cartons)")


def ls_sources(store: Store, out: Output) -> None:
    """Per kind of source, the bytes fetched into the store and those not
    fetched because the store had them, as every process counted them."""
    figures = store.source_bytes()
    if out.as_json:
        print_json({f.kind: f.as_json() for f in figures})
        return
    lines = [f"{'source':8}  {'fetched':>10}  {'blobs':>6}  {'reused':>10}  {'blobs':>6}"]
    lines += [f"{f.kind:8}  {format_size(f.fetched_bytes):>10}  {f.fetched_blobs:>6}  "
              f"{format_size(f.reused_bytes):>10}  {f.reused_blobs:>6}" for f in figures]
    print("\n".join(lines))


def cmd_inspect(store: Store, args: argparse.Namespace, out: Output) -> None:
    from .inspect import describe_ref, render_text

    data = describe_ref(store, args.ref)
    print_json(data) if out.as_json else print(render_text(data))


def cmd_export(store: Store, args: argparse.Namespace, out: Output) -> None:
    out.written(store.export(args.ref, Path(args.output), link_prefix=args.links,
                             link_min_size=parse_size(args.link_min_size), compression=args.compression))


def cmd_rm(store: Store, args: argparse.Namespace, out: Output) -> None:
    r = store.remove(args.ref)
    out.emit({"manifest_sha256": r.digest, "blobs_removed": r.blobs_removed, "bytes_freed": r.bytes_freed},
             [f"removed {r.digest}: {r.blobs_removed} blob(s), {format_size(r.bytes_freed)} freed", r.digest])


def refetch_missing(store: Store, args: argparse.Namespace) -> list[str]:
    """After a repair: fetch blobs that cartons lack again from their known
    sources (LINKS URLs, mirrors, the carton's URL). Returns what happened."""
    notes: list[str] = []

    async def work(p: Puller) -> None:
        for info in store.list():
            if not info.missing_blobs:
                continue
            try:
                n = await p.complete(info.row.digest)
                notes.append(f"refetched {n} blob(s) of carton {info.row.digest}")
            except CartonStoreError as e:
                notes.append(f"could not refetch blobs of carton {info.row.digest}: {e}")

    args.progress = "none"
    with_puller(store, args, work)
    return notes


def cmd_verify(store: Store, args: argparse.Namespace, out: Output) -> int:
    r = store.verify(repair=args.repair)
    if args.repair:
        r.repaired.extend(refetch_missing(store, args))
    data = {"ok": r.ok, "blobs_checked": r.blobs_checked, "corrupt_blobs": r.corrupt_blobs,
            "missing_blobs": r.missing_blobs, "unindexed_blobs": r.unindexed_blobs,
            "stray_files": r.stray_files, "models_checked": r.models_checked,
            "damaged_models": r.damaged_models, "orphan_models": r.orphan_models, "repaired": r.repaired}
    lines = [f"checked {r.blobs_checked} blob(s) and {r.models_checked} model directory(ies)"]
    lines += [f"corrupt blob: {d}" for d in r.corrupt_blobs]
    lines += [f"missing blob (indexed, no file): {d}" for d in r.missing_blobs]
    lines += [f"stray file in blobs/: {p}" for p in r.stray_files]
    lines += [f"damaged model {d}: {'; '.join(p[:3])}" for d, p in r.damaged_models.items()]
    lines += [f"note: {len(r.unindexed_blobs)} sound blob(s) not in the index (left by an interrupted "
              "add; gc collects them)"] if r.unindexed_blobs else []
    lines += [f"repaired: {x}" for x in r.repaired]
    lines.append("ok" if r.ok or (args.repair and r.repaired) else "FAILED")
    out.emit(data, lines)
    return 0 if r.ok or (args.repair and r.repaired) else exit_code_for(IntegrityError("verify failed"))


# -- parser --------------------------------------------------------------------

HANDLERS: dict[str, Callable[[Store, argparse.Namespace, Output], int | None]] = {
    "add": cmd_add, "adopt": cmd_adopt, "path": cmd_path, "infer": cmd_infer, "selftest": cmd_selftest, "ls": cmd_ls,
    "inspect": cmd_inspect, "push": cmd_push, "export": cmd_export, "pack": cmd_pack, "rm": cmd_rm,
    "serve": cmd_serve, "csi": cmd_csi, "gc": cmd_gc, "verify": cmd_verify, "load": cmd_load, "unload": cmd_unload,
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or (``only``) just that command's: see parser.py."""
    return cli_parser.build_parser(HANDLERS, only=only)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The usual `cartonstore COMMAND ...` needs that command's parser only;
    # options before the command, --help and mistakes get all of them.
    parser = build_parser(only=argv[0] if argv and argv[0] in HANDLERS else None)
    args = parser.parse_args(arrange_argv(parser, argv))
    out = Output(args.json)
    try:
        if args.command == "pack":
            return args.func(None, args, out) or 0
        args.settings = load_settings(args)
        if args.command in ("serve", "gc", "load", "unload", "csi"):
            return args.func(None, args, out) or 0
        from cartonstore.store import Store

        reads_only = args.command in ("ls", "inspect", "path") or (args.command == "verify" and not args.repair)
        with (Store.for_reading if reads_only else Store)(args.settings.store.root,
                                                          zip_limits=args.settings.zip_limits()) as store:
            return args.func(store, args, out) or 0
    except PermissionError as e:   # the CLI's own rights fell short: which file, and who may use it
        return report_error(args, PermissionDenied(explained(e), subject=e.filename))
    except CartonStoreError as e:
        return report_error(args, e)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def report_error(args: argparse.Namespace, e: CartonStoreError) -> int:
    """One line on stderr (JSON with --json); the exit status of its category."""
    if args.json:   # a runner's stderr as a list of lines, not folded into the text
        import json  # here: the CLI's start imports no more than it must

        print(json.dumps({**e.details, "error": e.message}), file=sys.stderr)
    else:
        print(f"cartonstore {args.command}: error: {e}", file=sys.stderr)
    return exit_code_for(e)
