"""The CLI's commands that run or reach the daemon: serve; csi (the node
plugin, a client of the daemon); gc (which a
daemon serving the store runs between its requests, else this process);
load and unload (a model in the daemon, by Triton's repository routes)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cartonstore.format.units import format_size, parse_duration, parse_size

if TYPE_CHECKING:
    from cartonstore.client.infer import InferClient
    from cartonstore.config.load import Config
    from cartonstore.store import Store

    from .output import Output


def cmd_serve(store: Store | None, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.server.daemon import DaemonSettings, run_daemon, setup_logging
    from cartonstore.store.gc.plan import GcPolicy
    from cartonstore.store.root.layout import make_socket_dir

    cfg: Config = args.settings
    if args.print_config:
        import tomli_w

        print(tomli_w.dumps(cfg.as_dict()), end="")
        return
    cfg.store.root.mkdir(parents=True, exist_ok=True)
    make_socket_dir(cfg.socket_path)
    setup_logging(cfg.server.log_format, cfg.server.log_level)
    run_daemon(DaemonSettings(
        root=cfg.store.root, socket=cfg.socket_path, socket_mode=cfg.server.socket_mode,
        socket_group=cfg.server.socket_group or None, listen=cfg.server.listen or None,
        grpc_socket=cfg.grpc_socket_path, grpc_listen=cfg.server.grpc_listen or None,
        mirror_listen=cfg.mirror.listen or None, mirror_upstream=cfg.mirror.upstream,
        mirror_tag_ttl=cfg.mirror.tag_ttl,
        restore_loaded=cfg.server.restore_loaded and not args.no_restore, id=cfg.server.id,
        leases=cfg.leases,
        fetch=cfg.fetch_config(), zip_limits=cfg.zip_limits(), max_request_size=cfg.server.max_request_size,
        shared_memory_over_tcp=cfg.server.shared_memory_over_tcp, arena_size=cfg.server.arena_size,
        allow_tcp_local_sources=cfg.server.allow_tcp_local_sources,
        check_workers=cfg.server.check_worker_count,
        max_buffered=cfg.server.max_buffered, max_connections=cfg.server.max_connections,
        max_connections_per_peer=cfg.server.max_connections_per_peer, head_timeout=cfg.server.head_timeout,
        idle_timeout=cfg.server.idle_timeout,
        shutdown_timeout=cfg.server.shutdown_timeout, access_log=cfg.server.access_log,
        gc=GcPolicy(max_size=cfg.gc.max_size, min_free=cfg.gc.min_free, grace=cfg.gc.grace,
                    forget_unrecoverable=cfg.gc.forget_unrecoverable),
        gc_interval=cfg.gc.interval, response_cache_size=cfg.cache.size, runners=cfg.runners,
        tls_cert=cfg.server.tls_cert, tls_key=cfg.server.tls_key, tls_client_ca=cfg.server.tls_client_ca,
        token=cfg.server.api_token()))


def cmd_gc(store: Store | None, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.client.leases import Client, DaemonUnavailable
    from cartonstore.store import Store
    from cartonstore.store.gc.plan import GcPolicy, budget_lines, eviction_summary, unrecoverable_lines

    cfg: Config = args.settings
    policy = GcPolicy(
        max_size=parse_size(args.max_size) if args.max_size else cfg.gc.max_size,
        min_free=parse_size(args.min_free) if args.min_free else cfg.gc.min_free,
        grace=parse_duration(args.grace) if args.grace else cfg.gc.grace, dry_run=args.dry_run,
        forget_unrecoverable=args.forget_unrecoverable or cfg.gc.forget_unrecoverable)
    report = None
    if not args.local and cfg.socket_path.exists():
        try:  # the daemon serving this store runs it, between its own requests
            report = Client(cfg.socket_path).collect(max_size=policy.max_size, min_free=policy.min_free,
                                                     grace=policy.grace, dry_run=policy.dry_run,
                                                     forget_unrecoverable=policy.forget_unrecoverable)
            report["ran_in"] = "daemon"
        except DaemonUnavailable:
            report = None
    if report is None:
        with Store(cfg.store.root, zip_limits=cfg.zip_limits()) as local:
            report = {**local.collect(policy).as_dict(), "ran_in": "this process"}
    verb = "would free" if policy.dry_run else "freed"
    out.emit(report, [
        f"expired leases dropped: {report['expired_leases']}",
        f"unreferenced blobs: {report['unreferenced_blobs']} ({format_size(report['unreferenced_bytes'])})",
        f"tmp/ leftovers: {report['tmp_entries']} ({format_size(report['tmp_bytes'])})",
        eviction_summary(report), *unrecoverable_lines(report), *budget_lines(report),
        f"{verb} {format_size(report['freed_bytes'])} (ran in {report['ran_in']})",
    ])


WAIT_FOR_DAEMON = 120.0   # load --wait: seconds a starting daemon has to listen and be ready


def cmd_load(store: Store | None, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.client.infer import InferClient

    config = _model_config(args.model_config)
    client = InferClient(args.settings.socket_path)
    if args.wait:
        _wait_for_daemon(client)
    reason = client.load(args.name, config=config)
    version = client.metadata(args.name)["versions"][0]
    noted = {"reason": reason} if reason else {}
    out.emit({"name": args.name, "manifest_sha256": version, "state": "READY", **noted},
             [f"loaded {args.name}: version {version[:12]} is ready" + (f" ({reason})" if reason else ""), version])


def cmd_unload(store: Store | None, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.client.infer import InferClient

    InferClient(args.settings.socket_path).unload(args.name)
    out.emit({"name": args.name, "state": "UNAVAILABLE"}, [f"unloaded {args.name}"])


def cmd_csi(store: Store | None, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.csi.servicer import serve
    from cartonstore.server.daemon import setup_logging

    setup_logging(args.settings.server.log_format, args.settings.server.log_level)
    serve(args.endpoint, args.settings.socket_path, args.node_id)


def _model_config(text: str | None) -> str | None:
    """--config: Triton's model config, a JSON object, checked here so that a
    typo fails before the daemon is asked (it checks the fields)."""
    import json

    from cartonstore.errors import InvalidInput

    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise InvalidInput(f"--config is not JSON ({e}): give Triton's model config as a JSON object, "
                           """e.g. '{"max_batch_size": 8}'""", subject="--config") from None
    if not isinstance(parsed, dict):
        raise InvalidInput(f"--config must be a JSON object (Triton's model config), got {type(parsed).__name__}",
                           subject="--config")
    return text


def _wait_for_daemon(client: InferClient) -> None:
    """Until the daemon listens and is ready (restored what it had loaded),
    at most WAIT_FOR_DAEMON seconds; then its DaemonUnavailable stands."""
    import time

    from cartonstore.client.wire import DaemonUnavailable

    deadline = time.monotonic() + WAIT_FOR_DAEMON
    while True:
        try:
            if client.server_ready():
                return
        except DaemonUnavailable:
            if time.monotonic() >= deadline:
                raise
        if time.monotonic() >= deadline:
            return   # it answers, not ready: the load is queued behind its restore
        time.sleep(0.1)
