"""The plugin's gRPC door: CSI v1's Identity and Node services (csi.proto,
spec v1.12) on grpcio's threaded server, each call in a worker thread (a
publish blocks on the daemon and on mount(2)). No Controller service: model
volumes are inline ephemeral, made and removed on the node alone.

Errors become the spec's codes in one table (``status_of``); a daemon call
cut off by the call's deadline answers DEADLINE_EXCEEDED, which the kubelet
retries (and records the volume as maybe mounted, so it unpublishes it on
teardown either way).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.wrappers_pb2 import BoolValue

from cartonstore import __version__
from cartonstore.client import Client
from cartonstore.errors import (
    AlreadyExists,
    CartonStoreError,
    Conflict,
    IntegrityError,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unavailable,
)

from .proto import csi_pb2 as pb
from .proto import csi_pb2_grpc as pb_grpc
from .volumes import Volumes, check_publish, check_target

log = logging.getLogger(__name__)

PLUGIN_NAME = "csi.cartonstore.dev"
DEADLINE_MARGIN = 1.0         # seconds kept to answer before the kubelet's deadline
NO_DEADLINE_TIMEOUT = 600.0   # a caller that sets no deadline still gets an answer
WORKERS = 8
STOP_GRACE = 5.0   # seconds calls under way get to finish at SIGTERM

_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (IntegrityError, grpc.StatusCode.FAILED_PRECONDITION),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
]


def status_of(e: BaseException) -> grpc.StatusCode:
    if isinstance(e, Unavailable) and isinstance(e.__cause__, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return next((code for kind, code in _CODES if isinstance(e, kind)), grpc.StatusCode.INTERNAL)


def time_left(context: grpc.ServicerContext) -> float:
    remaining = context.time_remaining()
    if remaining is None:
        return NO_DEADLINE_TIMEOUT
    return max(remaining - DEADLINE_MARGIN, 0.1)


def answering(fn: Any) -> Any:
    """A servicer method whose cartonstore and OS errors end the call with
    their code and message."""
    def call(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(self, request, context)
        except (CartonStoreError, OSError) as e:
            code = status_of(e)
            log.log(logging.INFO if code != grpc.StatusCode.INTERNAL else logging.ERROR,
                    "%s: %s: %s", fn.__name__, code.name, e)
            context.abort(code, str(e))
    call.__name__ = fn.__name__
    return call


def check_volume(volume_id: str, path: str) -> Path:
    """An Unpublish's or a VolumeStats' volume and path, or InvalidInput."""
    if not volume_id:
        raise InvalidInput("volume_id is empty")
    return check_target(path)


class IdentityService(pb_grpc.IdentityServicer):
    def __init__(self, volumes: Volumes) -> None:
        self.volumes = volumes

    def GetPluginInfo(self, request: pb.GetPluginInfoRequest,
                      context: grpc.ServicerContext) -> pb.GetPluginInfoResponse:
        return pb.GetPluginInfoResponse(name=PLUGIN_NAME, vendor_version=__version__)

    def GetPluginCapabilities(self, request: pb.GetPluginCapabilitiesRequest,
                              context: grpc.ServicerContext) -> pb.GetPluginCapabilitiesResponse:
        return pb.GetPluginCapabilitiesResponse()   # Node only: no controller, no topology

    def Probe(self, request: pb.ProbeRequest,
              context: grpc.ServicerContext) -> pb.ProbeResponse:
        return pb.ProbeResponse(ready=BoolValue(value=self.volumes.client.ready()))


class NodeService(pb_grpc.NodeServicer):
    def __init__(self, volumes: Volumes, node_id: str) -> None:
        self.volumes = volumes
        self.node_id = node_id

    @answering
    def NodePublishVolume(self, request: pb.NodePublishVolumeRequest,
                          context: grpc.ServicerContext) -> pb.NodePublishVolumeResponse:
        publish = check_publish(request.volume_id, request.target_path, dict(request.volume_context),
                                is_block=request.volume_capability.HasField("block"))
        self.volumes.publish(publish, time_left(context))
        return pb.NodePublishVolumeResponse()

    @answering
    def NodeUnpublishVolume(self, request: pb.NodeUnpublishVolumeRequest,
                            context: grpc.ServicerContext) -> pb.NodeUnpublishVolumeResponse:
        self.volumes.unpublish(request.volume_id, check_volume(request.volume_id, request.target_path))
        return pb.NodeUnpublishVolumeResponse()

    @answering
    def NodeGetVolumeStats(self, request: pb.NodeGetVolumeStatsRequest,
                           context: grpc.ServicerContext) -> pb.NodeGetVolumeStatsResponse:
        usage = self.volumes.usage(check_volume(request.volume_id, request.volume_path))
        return pb.NodeGetVolumeStatsResponse(
            usage=[pb.VolumeUsage(used=usage.bytes, total=usage.bytes, available=0, unit=pb.VolumeUsage.BYTES),
                   pb.VolumeUsage(used=usage.files, total=usage.files, available=0, unit=pb.VolumeUsage.INODES)],
            volume_condition=pb.VolumeCondition(abnormal=usage.abnormal, message=usage.message))

    def NodeGetCapabilities(self, request: pb.NodeGetCapabilitiesRequest,
                            context: grpc.ServicerContext) -> pb.NodeGetCapabilitiesResponse:
        kinds = (pb.NodeServiceCapability.RPC.GET_VOLUME_STATS, pb.NodeServiceCapability.RPC.VOLUME_CONDITION)
        return pb.NodeGetCapabilitiesResponse(capabilities=[
            pb.NodeServiceCapability(rpc=pb.NodeServiceCapability.RPC(type=kind)) for kind in kinds])

    def NodeGetInfo(self, request: pb.NodeGetInfoRequest,
                    context: grpc.ServicerContext) -> pb.NodeGetInfoResponse:
        return pb.NodeGetInfoResponse(node_id=self.node_id)


def start(endpoint: str, volumes: Volumes, node_id: str | None = None) -> grpc.Server:
    """Serve on ``endpoint`` (``unix:///path``, as the kubelet's registrar
    names it); a socket file left by a plugin before this one is replaced."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="csi"))
    pb_grpc.add_IdentityServicer_to_server(IdentityService(volumes), server)
    pb_grpc.add_NodeServicer_to_server(NodeService(volumes, node_id or socket.gethostname()), server)
    server.add_insecure_port(grpc_address(endpoint))
    server.start()
    return server


def grpc_address(endpoint: str) -> str:
    """``unix:///csi/csi.sock`` as grpcio takes it, the stale socket file removed."""
    if not endpoint.startswith("unix://"):
        raise InvalidInput(f"--endpoint {endpoint!r}: the CSI plugin listens on a Unix socket, unix:///path")
    path = endpoint.removeprefix("unix://")
    if not os.path.isabs(path):
        raise InvalidInput(f"--endpoint {endpoint!r}: the socket path must be absolute (unix:///csi/csi.sock)")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return f"unix:{path}"


def serve(endpoint: str, daemon_socket: Path, node_id: str | None = None) -> None:
    """Run the plugin until SIGTERM or SIGINT, then stop taking calls and
    let those under way finish (a few seconds)."""
    volumes = Volumes(Client(daemon_socket))
    for mount in volumes.found():
        log.info("model %s is mounted at %s: kept, with its volume's lease", mount.model_digest, mount.mount_point)
    server = start(endpoint, volumes, node_id)
    log.info("CSI plugin %s %s on %s, daemon at %s", PLUGIN_NAME, __version__, endpoint, daemon_socket)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _sig, _frame: stopping.set())
    stopping.wait()
    server.stop(STOP_GRACE).wait()
