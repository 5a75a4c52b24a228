"""The parameters of a Triton load request: its model config and the
files uploaded as base64 "file:<version>/<path>" parameters."""

from __future__ import annotations

import asyncio
import base64
import binascii
import shutil
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc.model_config_pb2 import ModelConfig

from cartonstore.errors import InvalidInput
from cartonstore.fetch.puller import Puller, PullResult
from cartonstore.format.paths import validate_carton_path
from cartonstore.store.materialize.tree import remove_tree
from cartonstore.store.root.owner import tmp_name
from cartonstore.v2.json_codec import loads

_INT64 = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)


def parse_triton_config(value: Any) -> dict | None:
    """A load's config as Triton reads it: protobuf JSON of
    ``inference.ModelConfig`` (an integer field takes 16 and "16", enums by
    name, an unknown field refused with protobuf's words), answered as
    Triton writes a config (proto field names, set fields only, int64 as
    numbers). A max_batch_size of 0 given is kept (it turns off the
    carton's own batching), and so is an instance group's count of 0 (it is
    refused by name, not read as the default of one), though protobuf
    writes no field at 0."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"parameter 'config' must be a JSON string, got {type(value).__name__}")
    try:
        given = loads(value.encode())
    except (ValueError, RecursionError) as e:
        raise InvalidInput(f"parameter 'config' is not valid JSON: {e}", subject="config") from None
    if not isinstance(given, dict):
        raise InvalidInput("parameter 'config' must be a JSON object (a Triton ModelConfig)", subject="config")
    try:
        message = json_format.ParseDict(given, ModelConfig())
    except json_format.ParseError as e:
        raise InvalidInput(f"parameter 'config' is not a Triton ModelConfig: {str(e).splitlines()[0]}",
                           subject="config") from None
    doc = _int64_as_numbers(json_format.MessageToDict(message, preserving_proto_field_name=True),
                            ModelConfig.DESCRIPTOR)
    if "max_batch_size" in given or "maxBatchSize" in given:
        doc["max_batch_size"] = message.max_batch_size
    groups = given.get("instance_group", given.get("instanceGroup"))
    if isinstance(groups, list):
        for i, (group, parsed) in enumerate(zip(groups, doc.get("instance_group", ()), strict=True)):
            if isinstance(group, dict) and "count" in group:
                parsed["count"] = message.instance_group[i].count
    return doc


def _int64_as_numbers(doc: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    """Protobuf JSON writes int64 fields as strings; Triton's config JSON
    (ModelConfigToJson) and the checks here read numbers."""
    for name, value in doc.items():
        field = descriptor.fields_by_name[name]
        if field.cpp_type in _INT64:
            doc[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.message_type is not None:
            entry = field.message_type
            if entry.GetOptions().map_entry:
                entry, value = entry.fields_by_name["value"].message_type, list(value.values())
            for item in value if isinstance(value, list) else [value]:
                if entry is not None:
                    _int64_as_numbers(item, entry)
    return doc


def b64_parameter(key: str, value: Any) -> bytes:
    """An uploaded file's bytes: base64 text (Triton's HTTP form), or bytes
    as they are (gRPC's bytes_param)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise InvalidInput(f"parameter 'file:{key}' must be a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"parameter 'file:{key}' is not valid base64") from None


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Files of an unpacked carton named file:<version>/<path>; paths are
    checked so an upload can never write outside its directory."""
    for key, data in files.items():
        _version, _, rel = key.partition("/")
        if not rel:
            raise InvalidInput(f"parameter 'file:{key}' must be named file:<version>/<path>")
        validate_carton_path(rel)
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if not (root / "carton.toml").exists():
        shutil.rmtree(root, ignore_errors=True)
        raise InvalidInput("the uploaded files are not a carton: give one file:<v>/<name>.carton, "
                           "or the files of an unpacked carton including carton.toml")


async def add_uploaded(puller: Puller, tmp_dir: Path, name: str, files: dict[str, Any]) -> PullResult:
    """Triton's file:<version>/<path> uploads added as ``name``: one
    .carton, or the files of an unpacked carton."""
    work = tmp_name(tmp_dir, "upload")
    try:
        # Uploads may be hundreds of MiB: decoding them would stall every request.
        decoded = await asyncio.to_thread(lambda: {k: b64_parameter(k, v) for k, v in files.items()})
        cartons = [k for k in decoded if k.endswith(".carton")]
        work.mkdir()
        if len(decoded) == 1 and cartons:
            target = work / "upload.carton"
            await asyncio.to_thread(target.write_bytes, decoded[cartons[0]])
        else:
            target = work / "carton"
            await asyncio.to_thread(write_tree, target, decoded)
        return await puller.add(str(target), name=name, force=True)
    finally:
        await asyncio.to_thread(remove_tree, work)
