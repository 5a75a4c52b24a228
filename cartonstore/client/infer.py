"""Inference through the daemon, for Python callers and `cartonstore infer`.

    from cartonstore.client.infer import InferClient
    with InferClient() as c:                  # $CARTONSTORE_SOCKET or the default socket
        out = c.infer("resnet", {"x": np.zeros((1, 3, 224, 224), np.float32)})

Requests and responses use the binary tensor data extension (the same
codec as the daemon and the runners: cartonstore.v2.framing). Standard
library HTTP, like cartonstore.client.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import numpy as np

from cartonstore.v2.framing import HEADER_LENGTH, encode_infer_request, parse_infer_response

from .wire import DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_TIMEOUT, address, error_for, exchange, json_body


class InferClient:
    """Blocking inference client of the daemon (one connection per request)."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *, base_url: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self._addr = address(socket_path, base_url)
        self._timeout = timeout

    def __enter__(self) -> InferClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], *, outputs: Sequence[str] | None = None,
              version: str | None = None, parameters: Mapping[str, Any] | None = None,
              request_id: str | None = None) -> dict[str, np.ndarray]:
        """Run one request; returns the outputs by name. Errors are the
        daemon's, as cartonstore.errors classes (400 InvalidInput, ...)."""
        parts, header_length = encode_infer_request(inputs, binary=True, outputs=outputs, binary_outputs=True,
                                                    request_id=request_id, parameters=parameters)
        headers = {"Content-Type": "application/octet-stream"}
        if header_length is not None:
            headers[HEADER_LENGTH] = str(header_length)
        status, answer_headers, body = self._exchange("POST", _model_path(model, version) + "/infer",
                                                      b"".join(parts), headers)
        if status != 200:
            raise error_for(status, body, model)
        length = answer_headers.get(HEADER_LENGTH.lower())
        _header, arrays = parse_infer_response(body, int(length) if length is not None else None)
        return arrays

    def metadata(self, model: str, version: str | None = None) -> dict[str, Any]:
        status, _, body = self._exchange("GET", _model_path(model, version), None, {})
        return json_body(status, body, model)

    def server_ready(self) -> bool:
        """Whether the daemon is ready: started, and done loading again what it had loaded."""
        return self._exchange("GET", "/v2/health/ready", None, {})[0] == 200

    def is_ready(self, model: str) -> bool:
        return self._exchange("GET", _model_path(model, None) + "/ready", None, {})[0] == 200

    def selftest(self, model: str, *, version: str | None = None, rtol: float | None = None,
                 atol: float | None = None) -> dict[str, Any]:
        """The model's self-test report ({"passed", "summary", "tests": [...]});
        a failing test is in the report, not an exception."""
        doc = {k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None}
        status, _, body = self._exchange("POST", _model_path(model, version) + "/selftest", json.dumps(doc).encode(),
                                         {"Content-Type": "application/json"})
        return json_body(status, body, model)

    def tensor(self, model: str, name: str, *, version: str | None = None) -> np.ndarray:
        """Tensor ``name`` of the model's tensor_data/, as a numpy array."""
        status, headers, body = self._exchange("GET", f"{_model_path(model, version)}/tensors/{quote(name, safe='')}",
                                               None, {"Accept": "application/octet-stream"})
        if status != 200:
            raise error_for(status, body, model)
        length = headers.get(HEADER_LENGTH.lower())
        return parse_infer_response(body, int(length) if length is not None else None)[1][name]

    def examples(self, model: str, *, version: str | None = None) -> list[dict[str, Any]]:
        """The carton's [[example]] entries, each input and sample output a
        link: {"tensor", "url"} or {"file", "url", "content_type"}."""
        status, _, body = self._exchange("GET", _model_path(model, version) + "/examples", None, {})
        return json_body(status, body, model)["examples"]

    def unload(self, model: str) -> None:
        status, _, body = self._exchange("POST", f"/v2/repository/models/{quote(model, safe='')}/unload", b"{}",
                                         {"Content-Type": "application/json"})
        json_body(status, body, model)

    def load(self, model: str, *, config: str | None = None) -> str:
        """Load ``model`` (a name the store knows) and return once it is ready,
        with the daemon's note ("" or why it loaded as files only);
        ``config``: Triton's model config as JSON text. A load may fetch the
        model first: it is waited for up to DEFAULT_ACQUIRE_TIMEOUT."""
        body = {"parameters": {"config": config}} if config is not None else {}
        status, _, answer = self._exchange("POST", f"/v2/repository/models/{quote(model, safe='')}/load",
                                           json.dumps(body).encode(), {"Content-Type": "application/json"},
                                           timeout=max(self._timeout, DEFAULT_ACQUIRE_TIMEOUT))
        reason = json_body(status, answer, model).get("reason", "")
        return reason if isinstance(reason, str) else ""

    def _exchange(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                  timeout: float | None = None) -> tuple[int, dict[str, str], bytes]:
        return exchange(self._addr, method, path, body, headers, timeout or self._timeout)


def _model_path(model: str, version: str | None) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return path + (f"/versions/{quote(version, safe='')}" if version else "")


def outputs_as_json(outputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Outputs for `--json`: datatype, shape and row-major data (bytes as text when UTF-8)."""
    from cartonstore.v2.datatypes import datatype_of

    out = {}
    for name, array in outputs.items():
        flat = array.reshape(-1).tolist()
        if array.dtype == object:
            flat = [_text(v) for v in flat]
        out[name] = {"datatype": datatype_of(array), "shape": list(array.shape), "data": flat}
    return out


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value.hex()
    return value


def describe_outputs(outputs: Mapping[str, np.ndarray]) -> list[str]:
    lines = []
    for name, array in outputs.items():
        lines.append(f"{name}: {array.dtype} {list(array.shape)}")
        lines.append(np.array2string(array, threshold=64))
    return lines


def parse_input_arg(text: str, datatypes: Mapping[str, str]) -> tuple[str, np.ndarray]:
    """NAME=FILE.npy or NAME=JSON (a number, list or string), typed by the
    model's datatype for NAME. Raises InvalidInput naming the argument."""
    from cartonstore.errors import InvalidInput
    from cartonstore.v2.datatypes import numpy_dtype

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise InvalidInput(f"--input {text!r}: expected NAME=FILE.npy or NAME=JSON")
    if name not in datatypes:
        raise InvalidInput(f"--input {text!r}: the model has no input {name!r} (inputs: {', '.join(datatypes)})")
    datatype = datatypes[name]
    if value.endswith(".npy"):
        try:
            return name, np.load(value, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InvalidInput(f"--input {name}: cannot read {value}: {e}") from None
    try:
        data = json.loads(value)
    except json.JSONDecodeError:
        if datatype != "BYTES":
            raise InvalidInput(f"--input {name}: {value!r} is neither a .npy file nor JSON") from None
        data = value  # a bare string for a BYTES input
    if datatype == "BYTES":
        array = np.array(data, dtype=object)
        return name, np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(array) \
            if array.size else array
    try:
        return name, np.array(data, dtype=numpy_dtype(datatype))
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidInput(f"--input {name}: {value!r} is not {datatype} data: {e}") from None
