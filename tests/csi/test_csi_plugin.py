"""The CSI node plugin driven as the kubelet drives it: the CSI spec's
messages on its gRPC socket (the stubs protoc made of csi.proto), a real
daemon, real bind mounts under a temporary directory (root only)."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import carton_entries, short_dir, write_zip

from cartonstore.cli.commands import main

if os.geteuid() != 0:
    pytest.skip("the CSI plugin bind-mounts model directories: mount(2) needs root", allow_module_level=True)

from cartonstore.csi.mountinfo import parse_mountinfo
from cartonstore.csi.proto import csi_pb2 as pb
from cartonstore.csi.proto import csi_pb2_grpc as pb_grpc

TOML = b'spec_version = 1\nmodel_name = "%s"\n[runner]\nrunner_name = "tensorflow"\nrequired_framework_version = "*"\n'
WEIGHTS = {"alpha": os.urandom(30_000), "beta": os.urandom(20_000), "slow": os.urandom(25_000),
           "once": os.urandom(25_000)}
MNT_DETACH = 2


def _carton(dest: Path, name: str) -> Path:
    files = {"carton.toml": TOML % name.encode(), "model/w.bin": WEIGHTS[name]}
    return write_zip(dest / f"{name}.carton", carton_entries(files))


def _mounts_under(base: Path) -> list[str]:
    table = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    return [m.mount_point for m in table if m.mount_point.startswith(f"{base}/")]


def _unmount_all_under(base: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for point in reversed(_mounts_under(base)):
        libc.umount2(os.fsencode(point), MNT_DETACH)


def _can_mount(base: Path) -> str | None:
    source, target = base / "probe-source", base / "probe-target"
    source.mkdir()
    target.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(os.fsencode(source), os.fsencode(target), None, ctypes.c_ulong(0x1000), None) != 0:
        return os.strerror(ctypes.get_errno())
    libc.umount2(os.fsencode(target), MNT_DETACH)
    return None


class Plugin:
    """`cartonstore csi` in its own process, and a channel to it."""

    def __init__(self, base: Path, daemon_socket: Path) -> None:
        self.endpoint = base / "csi.sock"
        self.argv = [sys.executable, "-m", "cartonstore.cli", "csi", "--endpoint", f"unix://{self.endpoint}",
                     "--socket", str(daemon_socket), "--root", str(base / "root"), "--node-id", "node-1"]
        self.log = base / "csi.log"
        self.proc: subprocess.Popen | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> Plugin:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.argv, stderr=log, stdout=log)
        self.channel = grpc.insecure_channel(f"unix:{self.endpoint}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.identity = pb_grpc.IdentityStub(self.channel)
        self.node = pb_grpc.NodeStub(self.channel)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[Path, object, Plugin]]:
    from kit.daemonkit import DaemonProcess

    with short_dir("cs-csi-") as base:
        try:
            reason = _can_mount(base)
            if reason is not None:
                pytest.skip(f"bind mounts are not allowed here: {reason}")
            src, root = base / "src", base / "root"
            src.mkdir()
            for name in ("alpha", "beta"):
                assert main(["add", str(_carton(src, name)), "--name", name, "--root", str(root),
                             "--progress", "none"]) == 0
            with DaemonProcess(root, listen=None) as daemon:
                plugin = Plugin(base, daemon.socket_path).start()
                try:
                    yield base, daemon, plugin
                finally:
                    plugin.stop()
        finally:
            _unmount_all_under(base)


@pytest.fixture
def targets(node) -> Iterator[Path]:
    """A directory for this test's targets; whatever is left mounted there is unmounted."""
    base = node[0] / "pods" / os.urandom(4).hex()
    base.mkdir(parents=True)
    try:
        yield base
    finally:
        _unmount_all_under(base)


def _publish(plugin: Plugin, volume_id: str, target: Path, timeout: float = 60, **context: str) -> None:
    attributes = {"csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.name": "pod-1", **context}
    request = pb.NodePublishVolumeRequest(
        volume_id=volume_id, target_path=str(target), readonly=True, volume_context=attributes,
        volume_capability=pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(),
            access_mode=pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY)))
    plugin.node.NodePublishVolume(request, timeout=timeout)


def _unpublish(plugin: Plugin, volume_id: str, target: Path) -> None:
    plugin.node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target)),
                                    timeout=30)


def _code(fn, *args, **kw) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        fn(*args, **kw)
    return caught.value.code(), caught.value.details()


def _models(daemon) -> dict[str, dict]:
    from kit.daemonkit import call

    status, node = call(daemon, "GET", "/v1/node")
    assert status == 200, node
    return {",".join(m["names"]) or m["manifest_sha256"]: m for m in node["models"]}


def _store_bytes(daemon) -> int:
    from kit.daemonkit import call

    return call(daemon, "GET", "/v1/node")[1]["store"]["bytes"]


def test_identity_and_node_info(node) -> None:
    _, _, plugin = node
    info = plugin.identity.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=10)
    assert (info.name, info.vendor_version) == ("csi.cartonstore.dev", "0.1.0")
    assert plugin.identity.Probe(pb.ProbeRequest(), timeout=10).ready.value is True
    assert plugin.node.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=10).node_id == "node-1"
    kinds = {c.rpc.type for c in plugin.node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest(),
                                                                 timeout=10).capabilities}
    assert kinds == {pb.NodeServiceCapability.RPC.GET_VOLUME_STATS, pb.NodeServiceCapability.RPC.VOLUME_CONDITION}


def test_publish_is_read_only_idempotent_and_unpublish_releases(node, targets) -> None:
    from kit.daemonkit import call

    _, daemon, plugin = node
    target = targets / "mount"   # not there yet: the plugin makes it, as the kubelet expects
    _publish(plugin, "vol-a", target, model="alpha")
    assert (target / "model" / "w.bin").read_bytes() == WEIGHTS["alpha"]
    with pytest.raises(OSError) as refused:
        (target / "new").write_bytes(b"x")
    assert refused.value.errno == errno.EROFS
    digest = _models(daemon)["alpha"]["manifest_sha256"]

    _publish(plugin, "vol-a", target, model="alpha")   # the kubelet's retry: OK, nothing added
    _publish(plugin, "vol-a", target, model=digest, sha256=digest)
    assert _mounts_under(targets) == [str(target)]
    assert _models(daemon)["alpha"]["mounted"] == 1
    _, metrics = call(daemon, "GET", "/metrics")
    assert f'cartonstore_model_mounted{{digest="{digest[:12]}",model="alpha"}} 1.0' in metrics

    code, message = _code(_publish, plugin, "vol-a", target, model="beta")
    assert code == grpc.StatusCode.ALREADY_EXISTS and "already holds model" in message
    code, _ = _code(_publish, plugin, "vol-other", target, model="beta")
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert _models(daemon)["beta"]["leases"] == 0 and _models(daemon)["alpha"]["mounted"] == 1

    stats = plugin.node.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id="vol-a", volume_path=str(target)),
                                           timeout=10)
    used = {u.unit: u.used for u in stats.usage}
    files = [p for p in target.rglob("*") if p.is_file()]
    assert used[pb.VolumeUsage.BYTES] == sum(p.stat().st_size for p in files) >= _models(daemon)["alpha"]["size"]
    assert used[pb.VolumeUsage.INODES] == len(files) >= 2
    assert not stats.volume_condition.abnormal and "read-only" in stats.volume_condition.message

    _unpublish(plugin, "vol-a", target)
    assert not target.exists() and _mounts_under(targets) == []
    assert _models(daemon)["alpha"]["mounted"] == 0
    _unpublish(plugin, "vol-a", target)           # again: OK
    _unpublish(plugin, "vol-never", targets / "never")
    code, _ = _code(plugin.node.NodeGetVolumeStats,
                    pb.NodeGetVolumeStatsRequest(volume_id="vol-a", volume_path=str(target)), timeout=10)
    assert code == grpc.StatusCode.NOT_FOUND


def test_a_pin_the_model_does_not_match_mounts_nothing(node, targets) -> None:
    _, daemon, plugin = node
    code, message = _code(_publish, plugin, "vol-pin", targets / "m", model="alpha", sha256="0" * 64)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not the pinned sha256" in message
    assert _mounts_under(targets) == [] and _models(daemon)["alpha"]["leases"] == 0


@pytest.mark.parametrize(("change", "named"), [
    ({"context": {}}, "no 'model'"),
    ({"context": {"model": "ftp://example.com/m.carton"}}, "unknown source scheme 'ftp'"),
    ({"context": {"model": "/etc"}}, "a path on the node is not a volume's model"),
    ({"context": {"model": "alpha", "sha256": "abc"}}, "'sha256' must be a manifest hash"),
    ({"context": {"model": "alpha", "modle": "x"}}, "unknown volumeAttributes ['modle']"),
    ({"target": "relative/mount"}, "is not absolute"),
    ({"volume_id": ""}, "volume id must be a non-empty string"),
    ({"block": True}, "ask for a mount volume capability"),
])
def test_bad_input_is_invalid_argument_and_changes_nothing(node, targets, change, named) -> None:
    _, daemon, plugin = node
    before = _models(daemon)
    target = targets / "mount"
    capability = pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume()) if change.get("block") else \
        pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume())
    request = pb.NodePublishVolumeRequest(
        volume_id=change.get("volume_id", "vol-bad"), target_path=change.get("target", str(target)),
        volume_capability=capability, readonly=True, volume_context=change.get("context", {"model": "alpha"}))
    code, message = _code(plugin.node.NodePublishVolume, request, timeout=30)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and named in message
    assert not target.exists() and _mounts_under(targets) == []
    assert _models(daemon) == before


def test_twenty_volumes_of_one_model_cost_one_copy(node, targets) -> None:
    _, daemon, plugin = node
    _publish(plugin, "vol-warm", targets / "warm", model="beta")
    stored = _store_bytes(daemon)
    for i in range(20):
        _publish(plugin, f"vol-{i}", targets / f"pod-{i}", model="beta")
    assert _store_bytes(daemon) == stored
    assert _models(daemon)["beta"]["mounted"] == 21
    assert len(_mounts_under(targets)) == 21
    assert all((targets / f"pod-{i}" / "model" / "w.bin").stat().st_ino ==
               (targets / "warm" / "model" / "w.bin").stat().st_ino for i in range(20))
    for i in range(20):
        _unpublish(plugin, f"vol-{i}", targets / f"pod-{i}")
    _unpublish(plugin, "vol-warm", targets / "warm")
    assert _models(daemon)["beta"]["mounted"] == 0 and _mounts_under(targets) == []


def test_a_slow_fetch_answers_deadline_exceeded_and_the_retry_takes_the_same_fetch(node, targets, origin) -> None:
    from kit.origin import Fault

    base, _, plugin = node
    # the same run's baseline: what one fetch of a carton of the same shape sends
    origin.put("/once.carton", _carton(base / "src", "once").read_bytes())
    _publish(plugin, "vol-once", targets / "once", model=origin.url("/once.carton"))
    _unpublish(plugin, "vol-once", targets / "once")
    data = _carton(base / "src", "slow").read_bytes()
    origin.put("/slow.carton", data, fault=Fault(delay=3.0, times=1))
    url = origin.url("/slow.carton")
    code, _ = _code(_publish, plugin, "vol-slow", targets / "m", timeout=1.5, model=url)
    assert code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    _publish(plugin, "vol-slow", targets / "m", model=url)
    assert (targets / "m" / "model" / "w.bin").read_bytes() == WEIGHTS["slow"]
    assert origin.bytes_sent_for("/slow.carton") == origin.bytes_sent_for("/once.carton"), "one download, not two"
    assert origin.count("/slow.carton") == origin.count("/once.carton")
    _unpublish(plugin, "vol-slow", targets / "m")


def test_a_killed_plugin_restarted_keeps_its_volumes_and_gc_evicts_nothing_mounted(node, targets) -> None:
    from kit.daemonkit import call

    _, daemon, plugin = node
    _publish(plugin, "vol-k1", targets / "k1", model="alpha")
    _publish(plugin, "vol-k2", targets / "k2", model="alpha")
    plugin.stop(signal.SIGKILL)
    plugin.start()
    assert _mounts_under(targets) == [str(targets / "k1"), str(targets / "k2")]
    assert _models(daemon)["alpha"]["mounted"] == 2
    _publish(plugin, "vol-k1", targets / "k1", model="alpha")   # the kubelet's retry after the restart: OK

    status, report = call(daemon, "POST", "/v1/gc", json={"max_size": 1, "grace": 0})
    assert status == 200 and report["over_budget"], report
    models = _models(daemon)
    assert models["alpha"]["state"] == "cached" and models["alpha"]["mounted"] == 2
    _, node_status = call(daemon, "GET", "/v1/node")
    assert node_status["over_budget"] is True
    assert (targets / "k2" / "model" / "w.bin").read_bytes() == WEIGHTS["alpha"]

    _unpublish(plugin, "vol-k1", targets / "k1")
    _unpublish(plugin, "vol-k2", targets / "k2")
    assert _models(daemon)["alpha"]["mounted"] == 0 and _mounts_under(targets) == []


def test_a_volume_lease_has_no_ttl_and_no_renewal(node) -> None:
    from kit.daemonkit import call

    _, daemon, _ = node
    status, body = call(daemon, "POST", "/v1/leases", json={"model": "alpha", "volume": "v-api", "ttl": 60})
    assert status == 400 and "has no 'ttl'" in body["error"]
    status, lease = call(daemon, "POST", "/v1/leases", json={"model": "alpha", "volume": "v-api"})
    assert status == 200 and lease["lease"] == "volume:v-api" and lease["expires_at"] is None
    status, body = call(daemon, "POST", "/v1/leases/volume%3Av-api/renew", json={"ttl": 5})
    assert status == 400 and "no expiry to renew" in body["error"]
    assert call(daemon, "DELETE", "/v1/leases/volume%3Av-api")[0] == 200
    assert _models(daemon)["alpha"]["mounted"] == 0
