"""The parameters of a Triton load request: its model config and the
files uploaded as base64 "file:<version>/<path>" parameters."""

from __future__ import annotations

import base64
import binascii
import json
import shutil
from pathlib import Path
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.format.paths import validate_carton_path


def parse_triton_config(value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"parameter 'config' must be a JSON string, got {type(value).__name__}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise InvalidInput(f"parameter 'config' is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise InvalidInput("parameter 'config' must be a JSON object (a Triton ModelConfig)")
    return parsed


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
