"""A loaded carton's test data, served (files-only models too):

    GET /v2/models/{name}[/versions/{v}]/tensors/{tensor}   one tensor of tensor_data/
    GET /v2/models/{name}[/versions/{v}]/examples           the [[example]] entries, with links
    GET /v2/models/{name}[/versions/{v}]/misc/{path}        a misc/ file, typed

A tensor comes framed as an infer response's one output: binary (a JSON
header with its name, datatype, shape and binary_data_size, then its bytes;
Inference-Header-Content-Length gives the header's length) unless JSON is
asked for (Accept: application/json, or ?format=json).
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import web

from cartonstore.errors import InvalidCarton, InvalidInput, NotFound
from cartonstore.format.carton_toml import MISC_PREFIX, TENSOR_PREFIX
from cartonstore.format.media_types import SNIFF_BYTES, media_type
from cartonstore.format.paths import validate_carton_path
from cartonstore.format.tensor_data import INDEX, TensorEntry, load_tensors, parse_tensor_index
from cartonstore.server.inference import ready_model
from cartonstore.v2.binary_form import body_headers
from cartonstore.v2.framing import encode_infer_response

from .context import svc

if TYPE_CHECKING:
    from cartonstore.server.models.loaded_model import LoadedModel


def _loaded(request: web.Request) -> tuple[LoadedModel, Path]:
    service = svc(request)
    model = ready_model(service, request.match_info["name"], request.match_info.get("version"))
    return model, service.store.layout.model_path(model.digest)  # type: ignore[arg-type]  # READY: it has its digest


def _base(request: web.Request) -> str:
    version = request.match_info.get("version")
    base = f"/v2/models/{quote(request.match_info['name'], safe='')}"
    return base if version is None else f"{base}/versions/{quote(version, safe='')}"


def _entry(model_dir: Path, name: str) -> TensorEntry:
    try:
        raw = (model_dir / INDEX).read_bytes()
    except FileNotFoundError:
        raise NotFound("this carton has no tensor_data/", subject=name) from None
    entries = parse_tensor_index(raw)
    entry = next((e for e in entries if e.name == name), None)
    if entry is None:
        known = ", ".join(repr(e.name) for e in entries) or "none"
        raise NotFound(f"no tensor {name!r} in tensor_data/ (tensors: {known})", subject=name)
    if entry.inner is not None:
        raise InvalidInput(f"tensor {name!r} is nested, which KServe v2 cannot frame; fetch its inner tensors: "
                           f"{', '.join(entry.inner)}", subject=name)
    return entry


def _wants_json(request: web.Request) -> bool:
    if request.query.get("format") == "json":
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "application/octet-stream" not in accept


async def tensor(request: web.Request) -> web.StreamResponse:
    model, model_dir = _loaded(request)
    name = request.match_info["tensor"]

    def read() -> Any:
        entry = _entry(model_dir, name)
        return load_tensors([entry], lambda path: (model_dir / path).read_bytes())[name]
    array = await asyncio.to_thread(read)
    as_json = _wants_json(request)
    parts, header_length = await asyncio.to_thread(
        encode_infer_response, model_name=model.name, model_version=model.digest, request_id=None,
        outputs={name: array}, binary=lambda _: not as_json)
    response = web.StreamResponse(headers=body_headers(header_length))
    response.content_length = sum(memoryview(p).nbytes for p in parts)
    await response.prepare(request)
    for part in parts:   # the header, then the tensor's bytes as they are: no joined copy
        await response.write(memoryview(part).cast("B"))
    await response.write_eof()
    return response


def _link(base: str, ref: str, model_dir: Path) -> dict[str, Any]:
    if ref.startswith(TENSOR_PREFIX):
        name = ref[len(TENSOR_PREFIX):]
        return {"tensor": name, "url": f"{base}/tensors/{quote(name, safe='')}"}
    rel = ref[len(MISC_PREFIX):]
    return {"file": f"misc/{rel}", "url": f"{base}/misc/{quote(rel)}",
            "content_type": media_type(rel, _head(model_dir / "misc" / rel))}


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(SNIFF_BYTES)
    except OSError:
        return b""


async def examples(request: web.Request) -> web.Response:
    model, model_dir = _loaded(request)
    base = _base(request)

    def listing() -> list[dict[str, Any]]:
        out = []
        for example in model.carton.examples:  # type: ignore[union-attr]  # READY: it has its carton
            out.append({"name": example.name, "description": example.description,
                        "inputs": {k: _link(base, ref, model_dir) for k, ref in example.inputs.items()},
                        "sample_out": {k: _link(base, ref, model_dir) for k, ref in example.sample_out.items()}})
        return out
    return web.json_response({"model_name": model.name, "model_version": model.digest,
                              "examples": await asyncio.to_thread(listing)})


async def misc_file(request: web.Request) -> web.StreamResponse:
    _model, model_dir = _loaded(request)
    rel = request.match_info["path"]
    try:
        validate_carton_path(f"misc/{rel}")
    except InvalidCarton as e:
        raise InvalidInput(f"misc/{rel!r} is not a file path a carton can hold: {e.problem}", subject=rel) from None
    path = model_dir / "misc" / rel
    try:   # O_NOFOLLOW: a model directory's files are never links; one that is goes nowhere
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise NotFound(f"this carton has no file misc/{rel}", subject=rel) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotFound(f"misc/{rel} is not a file", subject=rel)
        head = f.read(SNIFF_BYTES)
    # A carton's file, on an API without authentication: never sniffed into
    # something else, and never run as a page (an .html or .svg may hold script).
    return web.FileResponse(path, headers={"Content-Type": media_type(rel, head), "X-Content-Type-Options": "nosniff",
                                           "Content-Security-Policy": "sandbox"})


def add_routes(router: web.UrlDispatcher) -> None:
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        router.add_get(prefix + "/tensors/{tensor}", tensor)
        router.add_get(prefix + "/examples", examples)
        router.add_get(prefix + "/misc/{path:.+}", misc_file)
