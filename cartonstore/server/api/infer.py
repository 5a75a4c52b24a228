"""POST /v2/models/{name}[/versions/{version}]/infer over aiohttp: the body
read (any Content-Encoding), then the inference core (server/inference/),
then the answer written. The daemon's front (server/http/) answers most
infer requests itself, and gives aiohttp those it does not frame (chunked).
"""

from __future__ import annotations

from aiohttp import web

from cartonstore.errors import InvalidInput
from cartonstore.server.inference import STREAM_ANSWER, InferCall, serving_or_loadable, widen_send_buffer
from cartonstore.server.inference import infer as run_infer
from cartonstore.server.tensors.shm_regions import peer_of
from cartonstore.v2.framing import HEADER_LENGTH

from .bodies import request_body
from .context import svc
from .responses import ERROR_TEXT


async def infer(request: web.Request) -> web.StreamResponse:
    service = svc(request)
    name, version = request.match_info["name"], request.match_info.get("version")
    model = serving_or_loadable(service, name, version)  # an unknown model is refused before its body is read
    if request.transport is None:
        raise InvalidInput("the connection closed before its request was read")
    peer = peer_of(request.transport)   # before an await: a connection gone meanwhile has no socket to ask
    body = await request_body(request)
    call = InferCall(name, version, peer, body, request.headers.get(HEADER_LENGTH),
                     request.headers.get("Accept-Encoding", ""))
    answer = await run_infer(service, model, call)
    payload = answer.joined()   # no slot here: nothing to join, in fact
    if len(payload) >= STREAM_ANSWER:
        return await _streamed(request, answer.status, answer.headers, payload)
    response = web.Response(status=answer.status, body=payload, headers=answer.headers)
    if answer.error_text:
        response[ERROR_TEXT] = answer.error_text
    return response


async def _streamed(request: web.Request, status: int, headers: dict[str, str],
                    payload: bytes | bytearray | memoryview) -> web.StreamResponse:
    """A big answer sent without copies: aiohttp would join it with the
    headers (Python < 3.12 has no gathering writelines), and the transport
    keeps a copy of whatever the socket did not take at once."""
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = len(payload)
    widen_send_buffer(request.transport)
    await response.prepare(request)
    try:
        await response.write(b"")   # the headers alone
        await response.write(memoryview(payload))
        await response.write_eof()
    except ConnectionResetError:
        pass   # the client left: aiohttp ends the connection as it does for any response it cannot send
    return response
