"""gRPC calls over TCP are let in by their headers, before their message.

grpcio reads a unary call's whole message (up to max_request_size) before
it runs the method, so a credential checked there comes too late: callers
with no token could make the daemon buffer a message each. The gate runs
when a call's headers have come: a call TcpAccess refuses gets a handler
that streams its request and never reads it, and answers with the error
the servicer gives (InferenceServicer.refuse); the open calls (ServerLive,
ServerReady, whose requests are empty by definition) are answered without
reading theirs, whoever asks. What a caller may send before that is the
TCP server's HTTP/2 window (grpc_server.py's TCP_TRANSPORT_OPTIONS).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from .servicer import OPEN, InferenceServicer, authorization_of


class TcpCallGate(grpc.aio.ServerInterceptor):
    def __init__(self, servicer: InferenceServicer) -> None:
        self.servicer = servicer

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None   # no such method: grpcio answers UNIMPLEMENTED, reading nothing
        method = details.method.rpartition("/")[2]   # "/inference.GRPCInferenceService/ModelInfer": ours alone
        if method in OPEN:
            return _unread(handler, method, self.servicer)
        # A client certificate opens no gRPC method (TcpAccess: /v1/blobs alone), so the headers decide
        # as the servicer does; the refusal then names the certificate where one was sent.
        if self.servicer.tcp_allowed(method, authorization_of(details.invocation_metadata)):
            return handler
        servicer = self.servicer

        async def refuse(_: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            await servicer.refuse(context, method)
        return grpc.stream_unary_rpc_method_handler(refuse)


def _unread(handler: grpc.RpcMethodHandler, method: str, servicer: InferenceServicer) -> grpc.RpcMethodHandler:
    """``method``'s own answer to its empty request, what the caller sent unread."""
    behaviour = getattr(servicer, method)
    request = OPEN[method]()

    async def answer(_: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        return await behaviour(request, context)
    return grpc.stream_unary_rpc_method_handler(answer, response_serializer=handler.response_serializer)
