"""inference.GRPCInferenceService: the v2 gRPC service, on the messages
tritonclient[grpc] ships, as a thin layer over the model service, the
inference core (the same checks, statistics and config as every door) and
server/calls/ (access, Triton's extensions). Errors become gRPC codes from
the HTTP status each would have had; Triton's trace and log settings are
refused by name.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from cartonstore import __version__
from cartonstore.errors import CartonStoreError, InvalidInput, PermissionDenied
from cartonstore.server.calls.access import TcpAccess
from cartonstore.server.calls.extensions import EXTENSIONS, cuda_register_problem, cuda_status_answer, tell_runners
from cartonstore.server.inference import StatusError, config_of, statistics, status_of
from cartonstore.server.models.metrics import Metrics
from cartonstore.server.models.service import ModelService
from cartonstore.server.tensors.shm_regions import Peer
from cartonstore.store.metadata.names import check_model_ref
from cartonstore.v2.grpc_form import parameter_value

from .infer import (
    code_for,
    grpc_infer,
    grpc_loaded_then_answered,
    grpc_stream_infer,
    loads_first,
    stream_error,
    streams,
)
from .unix_relay import UNIX_PEERS, PeerBook

log = logging.getLogger("cartonstore.server.grpc")
T = TypeVar("T")
STREAM_WINDOW = 64          # requests of one stream in flight at once
# What TCP callers may ask without a credential (as /v2/health/), with their requests (empty)
OPEN = {"ServerLive": pb.ServerLiveRequest, "ServerReady": pb.ServerReadyRequest}


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, service: ModelService, metrics: Metrics, book: PeerBook, access: TcpAccess, *,
                 max_request_size: int) -> None:
        self.service = service
        self.metrics = metrics
        self.book = book
        self.access = access
        self.max_request_size = max_request_size

    # -- who is asking, and the answer's status -----------------------------------

    def _peer(self, context: grpc.aio.ServicerContext, method: str) -> Peer:
        """The caller (a Unix-socket one by uid); a TCP one must show what
        TcpAccess asks of HTTP callers, as Bearer metadata."""
        grpc_peer = context.peer()
        relayed = self.book.peer_of(grpc_peer)
        if relayed is not None:
            return relayed
        if grpc_peer.startswith(UNIX_PEERS) and not self.book.over_tcp(grpc_peer):   # around the relay
            raise PermissionDenied("gRPC over a Unix socket is served on the daemon's gRPC socket only "
                                   "(server.grpc_socket)")
        has_cert = bool((context.auth_context() or {}).get("x509_pem_cert"))
        self.access.check(_tcp_path(method), authorization_of(context.invocation_metadata()), has_cert)
        return Peer(None)

    def tcp_allowed(self, method: str, authorization: str | None) -> bool:
        """Whether a TCP caller sending ``authorization`` may call ``method``
        (with a client certificate or without: one opens no gRPC method)."""
        try:
            self.access.check(_tcp_path(method), authorization, False)
        except CartonStoreError:
            return False
        return True

    async def refuse(self, context: grpc.aio.ServicerContext, method: str) -> None:
        """Answer a TCP call that tcp_allowed refused (its message unread)
        as every refused call is answered: logged, counted, with _peer's error."""
        async def work(_: Peer) -> None:
            raise AssertionError(f"a gRPC {method} over TCP refused by its headers was let in by _peer")
        await self._call(context, method, work)

    async def _call(self, context: grpc.aio.ServicerContext, method: str, work: Callable[[Peer], Awaitable[T]]) -> T:
        started = time.perf_counter()
        status = 200
        try:
            return await work(self._peer(context, method))
        except CartonStoreError as e:
            status = status_of(e)
            level = logging.WARNING if status >= 500 else logging.INFO
            log.log(level, "gRPC %s -> %s: %s", method, code_for(e).name, e)
            await context.abort(code_for(e), str(e))
        except asyncio.CancelledError:
            status = 499
            raise
        except Exception:
            status = 500
            log.exception("unexpected error in gRPC %s", method)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error (see the daemon's log)")
        finally:
            self.metrics.count_request(f"grpc:{method}", "RPC", status)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("gRPC %s -> %d in %.2f ms", method, status, (time.perf_counter() - started) * 1000)
        raise AssertionError("unreachable: abort raises")

    # -- health and metadata --------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return await self._call(context, "ServerLive", _const(pb.ServerLiveResponse(live=True)))

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        async def work(_: Peer) -> pb.ServerReadyResponse:
            return pb.ServerReadyResponse(ready=self.service.ready)
        return await self._call(context, "ServerReady", work)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        async def work(_: Peer) -> pb.ModelReadyResponse:
            check_model_ref(request.name, request.version or None)
            ready = self.service.loaded(request.name, request.version or None) is not None
            return pb.ModelReadyResponse(ready=ready)
        return await self._call(context, "ModelReady", work)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        answer = pb.ServerMetadataResponse(name="cartonstore", version=__version__, extensions=EXTENSIONS)
        return await self._call(context, "ServerMetadata", _const(answer))

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        async def work(_: Peer) -> pb.ModelMetadataResponse:
            check_model_ref(request.name, request.version or None)
            doc = await self.service.metadata(request.name, request.version or None)
            return json_format.ParseDict(doc, pb.ModelMetadataResponse(), ignore_unknown_fields=True)
        return await self._call(context, "ModelMetadata", work)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        async def work(_: Peer) -> pb.ModelConfigResponse:
            check_model_ref(request.name, request.version or None)
            doc = config_of(self.service, request.name, request.version or None)
            config = json_format.ParseDict(doc, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
            return pb.ModelConfigResponse(config=config)
        return await self._call(context, "ModelConfig", work)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        async def work(_: Peer) -> pb.ModelStatisticsResponse:
            if request.name:
                check_model_ref(request.name, request.version or None)
            doc = statistics(self.service, request.name or None, request.version or None)
            return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)
        return await self._call(context, "ModelStatistics", work)

    # -- inference ------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return await self._call(context, "ModelInfer",
                                lambda peer: grpc_infer(self.service, request, peer, self.max_request_size))

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: Any) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests run as they come, up to STREAM_WINDOW at once and
        max_request_size bytes of requests in flight (one bigger request
        runs alone); answers leave in the order the requests came. A failed
        request answers with its error_message and the stream goes on. A
        decoupled model's request answers with each response its model
        streams (grpc_stream_infer), run when its turn comes, each response
        read from its runner once the previous one is written."""
        peer = await self._call(context, "ModelStreamInfer", _const_peer)
        window = _StreamWindow(STREAM_WINDOW, self.max_request_size)
        answers: asyncio.Queue[tuple[asyncio.Task[pb.ModelStreamInferResponse] |
                                     AsyncGenerator[pb.ModelStreamInferResponse, None], int] | None] = asyncio.Queue()

        async def one(request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
            try:
                answer = await grpc_infer(self.service, request, peer, self.max_request_size)
                return pb.ModelStreamInferResponse(infer_response=answer)
            except CartonStoreError as e:
                return stream_error(request, e)
            except Exception:  # a bug answers this request, logged; the stream goes on
                log.exception("unexpected error in a gRPC stream's request")
                return stream_error(request, InvalidInput("internal error (see the daemon's log)"))

        async def read() -> None:
            try:
                async for request in request_iterator:
                    size = request.ByteSize()
                    await window.take(size)   # a slot before the work starts: nothing runs unanswered
                    if streams(self.service, request):
                        await answers.put((grpc_stream_infer(self.service, request, peer, self.max_request_size),
                                           size))
                    elif loads_first(self.service, request):
                        await answers.put((grpc_loaded_then_answered(self.service, request, peer,
                                                                     self.max_request_size), size))
                    else:
                        await answers.put((asyncio.ensure_future(one(request)), size))
            finally:
                await answers.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await answers.get()) is not None:
                work, size = item
                try:
                    if isinstance(work, asyncio.Future):
                        yield await work
                    else:
                        async with aclosing(work):
                            async for answer in work:
                                yield answer
                finally:
                    await window.give(size)
            await reader   # a broken stream's error, if any
        finally:
            reader.cancel()
            while not answers.empty():
                left = answers.get_nowait()
                if left is not None and isinstance(left[0], asyncio.Future):
                    left[0].cancel()

    # -- repository -----------------------------------------------------------------

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        async def work(_: Peer) -> pb.RepositoryIndexResponse:
            rows = await self.service.index(request.ready)
            models = [pb.RepositoryIndexResponse.ModelIndex(name=r["name"], version=r.get("version", ""),
                                                            state=r["state"], reason=r.get("reason", ""))
                      for r in rows]
            return pb.RepositoryIndexResponse(models=models)
        return await self._call(context, "RepositoryIndex", work)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        async def work(peer: Peer) -> pb.RepositoryModelLoadResponse:
            check_model_ref(request.model_name)
            await self.service.load(request.model_name, _load_parameters(request.parameters), peer=peer)
            return pb.RepositoryModelLoadResponse()
        return await self._call(context, "RepositoryModelLoad", work)

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        async def work(_: Peer) -> pb.RepositoryModelUnloadResponse:
            check_model_ref(request.model_name)
            await self.service.unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()
        return await self._call(context, "RepositoryModelUnload", work)

    # -- shared memory --------------------------------------------------------------

    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       context: Any) -> pb.SystemSharedMemoryStatusResponse:
        async def work(peer: Peer) -> pb.SystemSharedMemoryStatusResponse:
            regions = self.service.shm_regions.status(peer, request.name or None)
            return pb.SystemSharedMemoryStatusResponse(regions={
                r["name"]: pb.SystemSharedMemoryStatusResponse.RegionStatus(**r) for r in regions})
        return await self._call(context, "SystemSharedMemoryStatus", work)

    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        async def work(peer: Peer) -> pb.SystemSharedMemoryRegisterResponse:
            doc = {"key": request.key, "offset": request.offset, "byte_size": request.byte_size}
            self.service.shm_regions.register(peer, request.name, doc)
            return pb.SystemSharedMemoryRegisterResponse()
        return await self._call(context, "SystemSharedMemoryRegister", work)

    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        async def work(peer: Peer) -> pb.SystemSharedMemoryUnregisterResponse:
            tell_runners(self.service.shm_regions.unregister(peer, request.name or None))
            return pb.SystemSharedMemoryUnregisterResponse()
        return await self._call(context, "SystemSharedMemoryUnregister", work)

    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest,
                                     context: Any) -> pb.CudaSharedMemoryStatusResponse:
        async def work(_: Peer) -> pb.CudaSharedMemoryStatusResponse:
            cuda_status_answer(request.name or None)
            return pb.CudaSharedMemoryStatusResponse()
        return await self._call(context, "CudaSharedMemoryStatus", work)

    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest,
                                       context: Any) -> pb.CudaSharedMemoryRegisterResponse:
        async def work(_: Peer) -> pb.CudaSharedMemoryRegisterResponse:
            doc = {"raw_handle": {"b64": base64.b64encode(request.raw_handle).decode()},
                   "device_id": request.device_id, "byte_size": request.byte_size}
            devices = self.service.runner_host.config.devices
            raise InvalidInput(cuda_register_problem(doc, request.name, devices), subject=request.name)
        return await self._call(context, "CudaSharedMemoryRegister", work)

    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                                         context: Any) -> pb.CudaSharedMemoryUnregisterResponse:
        return await self._call(context, "CudaSharedMemoryUnregister", _const(pb.CudaSharedMemoryUnregisterResponse()))

    # -- what cartonstore does not serve ---------------------------------------------

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        await self._refuse(context, "TraceSetting", "Triton's trace extension")

    async def LogSettings(self, request: Any, context: Any) -> Any:
        await self._refuse(context, "LogSettings", "Triton's logging extension (set server.log_level)")

    async def _refuse(self, context: Any, method: str, what: str) -> None:
        async def work(_: Peer) -> None:   # reached once the caller may ask at all
            raise StatusError(501, f"cartonstore does not support {what}: {method}")
        await self._call(context, method, work)


def _tcp_path(method: str) -> str:
    """The path TcpAccess knows a gRPC method by."""
    return f"/v2/health/{method}" if method in OPEN else f"/inference.GRPCInferenceService/{method}"


def authorization_of(metadata: Any) -> str | None:
    """A call's Authorization metadata (grpcio gives keys in lower case)."""
    return dict(metadata or ()).get("authorization")


class _StreamWindow:
    """How much of a stream may be in flight: ``count`` requests and
    ``size`` bytes of them (a single bigger request alone)."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.requests = self.bytes = 0
        self._changed = asyncio.Condition()

    async def take(self, size: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.requests < self.count and
                                         (self.bytes + size <= self.size or self.requests == 0))
            self.requests += 1
            self.bytes += size

    async def give(self, size: int) -> None:
        async with self._changed:
            self.requests -= 1
            self.bytes -= size
            self._changed.notify_all()


def _const(answer: T) -> Callable[[Peer], Awaitable[T]]:
    async def work(_: Peer) -> T:
        return answer
    return work


async def _const_peer(peer: Peer) -> Peer:
    return peer


def _load_parameters(params: Any) -> dict[str, Any]:
    """A load's parameters as the service takes them (uploaded files as
    bytes, which load_params.b64_parameter takes as they are)."""
    return {key: parameter_value(param) for key, param in params.items()}
