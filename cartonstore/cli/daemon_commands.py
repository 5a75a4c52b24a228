"""The CLI's commands that run or reach the daemon: serve, and gc (which a
daemon serving the store runs between its requests, else this process)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cartonstore.format.units import format_size, parse_duration, parse_size

if TYPE_CHECKING:
    from cartonstore.config.load import Config
    from cartonstore.store import Store

    from .output import Output


def cmd_serve(store: Store | None, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.server.daemon import DaemonSettings, run_daemon, setup_logging
    from cartonstore.server.models.loaded_model import LeaseSettings
    from cartonstore.store.gc import GcPolicy

    cfg: Config = args.settings
    if args.print_config:
        import tomli_w

        print(tomli_w.dumps(cfg.as_dict()), end="")
        return
    cfg.store.root.mkdir(parents=True, exist_ok=True)
    setup_logging(cfg.server.log_format, cfg.server.log_level)
    run_daemon(DaemonSettings(
        root=cfg.store.root, socket=cfg.socket_path, socket_mode=cfg.server.socket_mode,
        socket_group=cfg.server.socket_group or None, listen=cfg.server.listen or None,
        grpc_socket=cfg.grpc_socket_path, grpc_listen=cfg.server.grpc_listen or None,
        restore_loaded=cfg.server.restore_loaded and not args.no_restore,
        leases=LeaseSettings(cfg.leases.default_ttl, cfg.leases.max_ttl, cfg.leases.pin_ttl),
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
        gc_interval=cfg.gc.interval, runners=cfg.runners, tls_cert=cfg.server.tls_cert,
        tls_key=cfg.server.tls_key, tls_client_ca=cfg.server.tls_client_ca, token=cfg.server.api_token()))


def cmd_gc(store: Store | None, args: argparse.Namespace, out: Output) -> None:
    from cartonstore.client.leases import Client, DaemonUnavailable
    from cartonstore.store import Store
    from cartonstore.store.gc import GcPolicy, eviction_summary, unrecoverable_lines

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
        eviction_summary(report), *unrecoverable_lines(report),
        f"{verb} {format_size(report['freed_bytes'])} (ran in {report['ran_in']})",
    ])
