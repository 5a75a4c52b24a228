"""Prometheus metrics of one daemon (prometheus_client, a registry per app).

Counters are bumped where things happen; gauges that describe the store
(size, leases) are read from the index when /metrics is scraped, so they
are true across every process sharing the store.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from cartonstore.store.metadata.gc_outcome import GcOutcome
    from cartonstore.store.metadata.model_states import ModelState
    from cartonstore.store.metadata.source_bytes import SourceBytes

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

SERVED_KINDS = ("blobs", "mirror")
"""Who the daemon serves stored bytes to: ``blobs``, peers and other callers
of /v1/blobs; ``mirror``, the callers of the node's OCI registry mirror."""

DIGEST_LABEL = 12   # hex digits of a manifest hash in a model's labels: unique in any store, short on a dashboard

# *_created series double the output and no dashboard here reads them.
disable_created_metrics()


class _Live(Collector):
    def __init__(self, read: Callable[[], dict[str, Any]], inference: Callable[[], list]) -> None:
        self.read = read
        self.inference = inference

    def collect(self) -> Iterator:
        values = self.read()
        yield GaugeMetricFamily("cartonstore_store_bytes", "Bytes of blobs in the store",
                                value=values["store_bytes"])
        yield GaugeMetricFamily("cartonstore_leases", "Live leases (all processes)", value=values["leases"])
        yield GaugeMetricFamily("cartonstore_loaded_models", "Models loaded through this daemon",
                                value=values["loaded_models"])
        yield CounterMetricFamily("cartonstore_fetched_bytes", "Bytes received from sources",
                                  value=values["fetched_bytes"])
        yield CounterMetricFamily("cartonstore_fetch_requests", "HTTP requests made to sources",
                                  value=values["fetch_requests"])
        by_source = CounterMetricFamily("cartonstore_fetched_source_bytes",
                                        "Bytes received by kind of source: peer (other nodes' stores), and the "
                                        "origins url (carton and LINKS URLs), mirror and registry",
                                        labels=["source"])
        for source, count in values.get("source_bytes", {}).items():
            if source != "file":   # read from local files, not fetched
                by_source.add_metric([source], count)
        yield by_source
        yield from _source_figure_families(values.get("source_figures", []))
        yield from _node_families(values.get("models", []), values.get("gc_outcome"), values.get("served", {}))
        yield from _runner_families(values.get("runners", []))
        yield from _inference_families(self.inference())
        yield from _arena_families(values.get("arena"))
        yield from _spare_families(values.get("spares"))
        yield from _check_families(values.get("check_workers"))
        yield from _response_cache_families(values.get("response_cache"))


def _source_figure_families(figures: list[SourceBytes]) -> Iterator:
    """The store's figures by kind of source (store/metadata/source_bytes.py):
    read from its index, so they count every process's adds and survive
    restarts."""
    nbytes = CounterMetricFamily("cartonstore_source_bytes", "Bytes the store's adds fetched by kind of source "
                                 "(url, oci, hf, peer, mirror, adopted), and bytes they did not fetch because the "
                                 "store had them (outcome fetched, reused); counted by every process on the store",
                                 labels=["kind", "outcome"])
    blobs = CounterMetricFamily("cartonstore_source_blobs", "Blobs the store's adds fetched by kind of source, and "
                                "blobs they did not fetch because the store had them (outcome fetched, reused)",
                                labels=["kind", "outcome"])
    ratio = GaugeMetricFamily("cartonstore_source_hit_ratio", "Of the bytes the store's adds wanted by kind of "
                              "source, the share it already had: reused / (reused + fetched); absent for a kind "
                              "that no add used yet", labels=["kind"])
    for f in figures:
        if f.hit_ratio is not None:
            ratio.add_metric([f.kind], f.hit_ratio)
        nbytes.add_metric([f.kind, "fetched"], f.fetched_bytes)
        nbytes.add_metric([f.kind, "reused"], f.reused_bytes)
        blobs.add_metric([f.kind, "fetched"], f.fetched_blobs)
        blobs.add_metric([f.kind, "reused"], f.reused_blobs)
    yield from (nbytes, blobs, ratio)


def _node_families(models: list[ModelState], outcome: GcOutcome | None, served: dict[str, int]) -> Iterator:
    """What the node holds, one series per stored model (labelled by its
    names and the start of its manifest hash), and whether it is full."""
    labels = ["model", "digest"]
    families = {
        "cached": GaugeMetricFamily("cartonstore_model_cached", "1 for a stored model with every blob in the store",
                                    labels=labels),
        "partial": GaugeMetricFamily("cartonstore_model_partial", "1 for a stored model some of whose blobs gc "
                                     "evicted (fetched again on use)", labels=labels),
        "leases": GaugeMetricFamily("cartonstore_model_leases", "Live leases on a stored model (clients, mounted "
                                    "volumes; a daemon's pins count as loaded)", labels=labels),
        "mounted": GaugeMetricFamily("cartonstore_model_mounted", "Volumes a stored model is mounted as (the CSI "
                                     "plugin's leases; counted in leases too)", labels=labels),
        "loaded": GaugeMetricFamily("cartonstore_model_loaded", "Names a stored model is loaded as by the daemons "
                                    "sharing the store", labels=labels),
        "bytes": GaugeMetricFamily("cartonstore_model_bytes", "Bytes of a stored model's files", labels=labels),
    }
    for m in models:
        key = [",".join(m.names), m.digest[:DIGEST_LABEL]]
        families["cached"].add_metric(key, int(m.state == "cached"))
        families["partial"].add_metric(key, int(m.state == "partial"))
        families["leases"].add_metric(key, m.leases)
        families["mounted"].add_metric(key, m.mounted)
        families["loaded"].add_metric(key, len(m.loaded_as))
        if m.size is not None:
            families["bytes"].add_metric(key, m.size)
    yield from families.values()
    yield GaugeMetricFamily("cartonstore_store_over_budget", "1 when the store's last gc with a budget could not "
                            "meet it because what is left is leased, loaded or has no source (GET /v1/node says "
                            "what); 0 otherwise", value=int(outcome is not None and outcome.over_budget is not None))
    family = CounterMetricFamily("cartonstore_served_bytes", "Stored bytes served, by kind of caller: blobs "
                                 "(/v1/blobs: peers), mirror (the OCI registry mirror)", labels=["kind"])
    for kind in SERVED_KINDS:
        family.add_metric([kind], served.get(kind, 0))
    yield family


def _inference_families(entries: list[tuple[str, str, dict]]) -> Iterator:
    requests = CounterMetricFamily("cartonstore_inference_requests", "Infer requests by model version and outcome "
                                   "(success, fail), as the statistics extension counts them",
                                   labels=["model", "version", "outcome"])
    seconds = CounterMetricFamily("cartonstore_inference_seconds", "Time of successful infer requests by phase: "
                                  "queue, compute_input, compute_infer, compute_output (and success: the whole)",
                                  labels=["model", "version", "phase"])
    for name, version, snap in entries:
        for outcome in ("success", "fail"):
            requests.add_metric([name, version, outcome], snap[outcome][0])
        for phase in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            seconds.add_metric([name, version, phase], snap[phase][1] / 1e9)
    yield from (requests, seconds)


# Triton's own series, named and typed as Triton exposes them (no _total suffix), so
# dashboards made for Triton chart cartonstore unchanged.
_TRITON_SERIES = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s["success"][0]),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", lambda s: s["fail"][0]),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s["inference_count"]),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s["execution_count"]),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds "
     "(includes cached requests)", lambda s: s["success"][1] // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds "
     "(includes cached requests)", lambda s: s["queue"][1] // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds "
     "(does not include cached requests)", lambda s: s["compute_input"][1] // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds "
     "(does not include cached requests)", lambda s: s["compute_infer"][1] // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds "
     "(does not include cached requests)", lambda s: s["compute_output"][1] // 1000),
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: s["cache_hit"][0]),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: s["cache_miss"][0]),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda s: s["cache_hit"][1] // 1000),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert + lookup) duration per model, in microseconds",
     lambda s: s["cache_miss"][1] // 1000),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def triton_text(entries: list[tuple[str, str, dict]]) -> bytes:
    """Triton's nv_inference_* counters of each loaded version, in the text format."""
    if not entries:
        return b""
    lines = []
    for metric, doc, value in _TRITON_SERIES:
        lines += [f"# HELP {metric} {doc}", f"# TYPE {metric} counter"]
        lines += [f'{metric}{{model="{_label(name)}",version="{_label(version)}"}} {value(snap)}'
                  for name, version, snap in entries]
    return ("\n".join(lines) + "\n").encode()


def _check_families(stats: dict[str, int] | None) -> Iterator:
    if stats is None:   # server.check_workers = 0
        return
    yield GaugeMetricFamily("cartonstore_check_workers", "Check worker processes running (big JSON infer "
                            "requests are parsed and checked there)", value=stats["workers"])
    yield CounterMetricFamily("cartonstore_check_worker_requests", "Infer requests checked by a check worker",
                              value=stats["checked"])
    yield CounterMetricFamily("cartonstore_check_worker_failures", "Check workers that failed or vanished "
                              "mid-request (the daemon checked the request itself)", value=stats["failed"])


def _response_cache_families(figures: dict[str, int] | None) -> Iterator:
    if figures is None:   # cache.size = 0
        return
    yield GaugeMetricFamily("cartonstore_response_cache_bytes", "Bytes of infer answers in the response cache "
                            "(of cache.size)", value=figures["bytes"])
    yield GaugeMetricFamily("cartonstore_response_cache_entries", "Infer answers in the response cache",
                            value=figures["entries"])
    yield CounterMetricFamily("cartonstore_response_cache_evictions", "Answers the response cache let go, least "
                              "recently used first, to keep within cache.size", value=figures["evictions"])


def _arena_families(stats: dict[str, int] | None) -> Iterator:
    if stats is None:   # server.arena_size = 0
        return
    yield GaugeMetricFamily("cartonstore_arena_slots", "Tensor arena slots held by infer requests",
                            value=stats["slots"])
    yield GaugeMetricFamily("cartonstore_arena_bytes", "Tensor arena bytes held by infer requests",
                            value=stats["bytes"])
    yield CounterMetricFamily("cartonstore_arena_requests", "Infer requests sent to runners through the tensor "
                              "arena (their tensors not copied over the runner's socket)", value=stats["forwarded"])
    yield CounterMetricFamily("cartonstore_arena_full", "Big infer bodies copied because the tensor arena had no "
                              "free span for them (raise server.arena_size)", value=stats["full"])


def _spare_families(spares: list[dict] | None) -> Iterator:
    if spares is None:   # runners.prewarm is off
        return
    family = GaugeMetricFamily("cartonstore_runner_spares", "Pre-warmed runners waiting for a load (runners.prewarm)",
                               labels=["kind", "device"])
    for (kind, device), count in sorted(collections.Counter((s["kind"], s["device"]) for s in spares).items()):
        family.add_metric([kind, device], count)
    yield family


def _runner_families(statuses: list[dict]) -> Iterator:
    labels = ["model", "version", "state"]
    up = GaugeMetricFamily("cartonstore_runner_instances", "Runner instances of loaded models by state",
                           labels=labels)
    restarts = CounterMetricFamily("cartonstore_runner_restarts", "Runner restarts after a crash or a hang",
                                   labels=["model", "version"])
    outstanding = GaugeMetricFamily("cartonstore_runner_outstanding", "Infer requests in flight to runners",
                                    labels=["model", "version"])
    sandbox = GaugeMetricFamily("cartonstore_runner_sandbox", "The layers a loaded model's runner sandbox holds "
                                "(1 per model, the layers in the label: bwrap+landlock+uid+cgroup:pids, or none)",
                                labels=["model", "version", "layers"])
    for st in statuses:
        sandbox.add_metric([st["name"], st["version"], st.get("sandbox", "none")], 1)
        by_state = collections.Counter(inst["state"] for inst in st["instances"])
        for state, count in by_state.items():
            up.add_metric([st["name"], st["version"], state], count)
        restarts.add_metric([st["name"], st["version"]], st["restarts"])
        outstanding.add_metric([st["name"], st["version"]], st["outstanding"])
    yield from (up, restarts, outstanding, sandbox)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("cartonstore_http_requests", "API requests by route and status",
                                ["route", "method", "status"], registry=self.registry)
        self.cache_hits = Counter("cartonstore_cache_hits", "Lease or load of a model already materialized",
                                  registry=self.registry)
        self.cache_misses = Counter("cartonstore_cache_misses", "Lease or load that had to fetch or build",
                                    registry=self.registry)
        # bytes served by kind of caller (SERVED_KINDS): plain ints, bumped on the event loop, read by
        # /metrics and GET /v1/node alike
        self.served_bytes = dict.fromkeys(SERVED_KINDS, 0)
        self.dedup_saved_bytes = Counter("cartonstore_dedup_saved_bytes",
                                         "Bytes not stored or fetched because the store had them",
                                         registry=self.registry)
        self.fetch_errors = Counter("cartonstore_fetch_errors", "Fetches that failed", registry=self.registry)
        self.model_unloads = Counter("cartonstore_model_unloads", "Models unloaded, by reason: asked (an unload "
                                     "request), idle (past its keep_alive), max_loaded and max_memory (room for "
                                     "another load), pressure (memory running short)",
                                     ["reason"], registry=self.registry)
        self._request_counters: dict[tuple[str, str, int], Any] = {}
        self._inference: Callable[[], list] = list

    def count_served(self, kind: str, nbytes: int) -> None:
        self.served_bytes[kind] += nbytes

    def count_request(self, route: str, method: str, status: int) -> None:
        # labels() costs ~5 us (a lock, a tuple of strings, a dict); an infer
        # request's whole budget in the daemon is ~100 us, so the children are kept.
        key = (route, method, status)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self._request_counters[key] = self.requests.labels(route, method, str(status))
        counter.inc()

    def watch(self, read: Callable[[], dict[str, float]], inference: Callable[[], list] = list) -> None:
        """read: the store's and runners' values; inference: (model, version,
        statistics snapshot) of each loaded version."""
        self.registry.register(_Live(read, inference))
        self._inference = inference

    def render(self) -> bytes:
        return generate_latest(self.registry) + triton_text(self._inference())
