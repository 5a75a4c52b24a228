"""safetensors headers: the 8-byte size, the JSON header, and the layout it describes.

A safetensors file is an 8-byte little-endian header size N, N bytes of JSON,
then a byte buffer that the header's tensors must cover exactly: contiguous
from 0, no holes (which would let a file be two formats at once), no
overlaps, nothing after the last tensor. Validation follows the reference
implementation (huggingface/safetensors) and is strict where it is loose:
the header must start with "{", duplicate keys, NaN/Infinity and extra tensor
fields are refused.

Reading the file is the caller's job: read 8 bytes, parse_header_size, read
N more, parse_safetensors_header.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cartonstore.errors import InvalidCarton

from . import strict_json
from ._toml import is_int, join_field, type_name
from .dtypes import SAFETENSORS_DTYPE_BITS

SAFETENSORS_HEADER_LIMIT = 100_000_000
METADATA_KEY = "__metadata__"
_SIZE_FIELD = 8
_U64_MAX = 2**64 - 1
_TENSOR_FIELDS = ("dtype", "shape", "data_offsets")


@dataclass(frozen=True)
class SafetensorsTensor:
    """One tensor: ``begin``/``end`` are offsets into the data buffer (after the header)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header; ``tensors`` are in data order (by offset)."""

    header_size: int
    tensors: tuple[SafetensorsTensor, ...]
    metadata: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def data_start(self) -> int:
        """File offset of the data buffer."""
        return _SIZE_FIELD + self.header_size

    def summary(self) -> dict[str, Any]:
        """What inspect shows of a file: its tensor count, parameter count and dtypes."""
        dtypes: dict[str, int] = {}
        for t in self.tensors:
            dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
        return {"tensors": len(self.tensors), "parameters": sum(math.prod(t.shape) for t in self.tensors),
                "dtypes": dict(sorted(dtypes.items()))}


def parse_header_size(first8: bytes, file_size: int, *, file: str) -> int:
    """The header size N from a file's first 8 bytes (more are ignored).

    Raises InvalidCarton(file, ...) when fewer than 8 bytes are given, N is
    over SAFETENSORS_HEADER_LIMIT, or 8 + N is more than ``file_size``.
    """
    if len(first8) < _SIZE_FIELD:
        raise InvalidCarton(
            file,
            f"is {len(first8)} bytes, too short for a safetensors file (the header size takes 8)",
        )
    size = int.from_bytes(first8[:_SIZE_FIELD], "little")
    _check_header_size(size, file_size, file)
    return size


def _check_header_size(size: int, file_size: int, file: str) -> None:
    if size > SAFETENSORS_HEADER_LIMIT:
        limit = SAFETENSORS_HEADER_LIMIT
        raise _bad_header(file, f"declares a {size}-byte header, over the {limit}-byte limit")
    if _SIZE_FIELD + size > file_size:
        problem = f"declares a {size}-byte header, but the file is only {file_size} bytes"
        raise _bad_header(file, problem)


def _bad_header(file: str, problem: str) -> InvalidCarton:
    return InvalidCarton(file, problem, field="header")


def parse_safetensors(head: bytes, file_size: int, *, file: str) -> SafetensorsHeader:
    """Parse a header from the start of a file (at least its first 8 + N bytes).

    Raises InvalidCarton as parse_header_size and parse_safetensors_header do,
    and when ``head`` stops before the end of the header.
    """
    size = parse_header_size(head, file_size, file=file)
    header = head[_SIZE_FIELD : _SIZE_FIELD + size]
    if len(header) < size:
        raise _bad_header(file, f"ends inside its {size}-byte header")
    return parse_safetensors_header(header, file_size, file=file)


def parse_safetensors_header(header: bytes, file_size: int, *, file: str) -> SafetensorsHeader:
    """Validate the N header bytes of a ``file_size``-byte safetensors file.

    Checks the JSON (UTF-8, starts with "{", trailing spaces allowed, no
    duplicate keys, no NaN/Infinity), ``__metadata__`` (a string -> string
    map), each tensor (exactly dtype, shape and data_offsets; a known dtype;
    non-negative integer dims and offsets; end - begin equal to the tensor's
    size in whole bytes) and the layout (contiguous from 0, no holes or
    overlaps, ending exactly at the end of the file).

    Raises InvalidCarton(file, ..., field="tensor 'w'.data_offsets") naming
    the tensor and field at fault, or field="header" for the JSON itself.
    """
    _check_header_size(len(header), file_size, file)
    top = _load_json(header, file)
    metadata = _metadata(top.pop(METADATA_KEY, None), file)
    tensors = [_tensor(name, info, file) for name, info in top.items()]
    tensors.sort(key=lambda t: (t.begin, t.end))
    _check_layout(tensors, file_size - _SIZE_FIELD - len(header), file)
    return SafetensorsHeader(header_size=len(header), tensors=tuple(tensors), metadata=metadata)


def _load_json(header: bytes, file: str) -> dict[str, Any]:
    if not header.startswith(b"{"):
        raise _bad_header(file, "must start with '{'")
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad_header(file, f"is not valid UTF-8 (bad byte at offset {e.start})") from None
    try:
        decode = strict_json.decoder(check_key=lambda key: _check_text(key, file, "header"),
                                     parse_constant=_no_constants(file))
        doc: dict[str, Any] = decode(text)   # it starts with '{': an object or no JSON at all
        return doc
    except strict_json.RepeatedKey as e:
        raise _bad_header(file, f"has the key {e.key!r} twice in one object") from None
    except json.JSONDecodeError as e:
        raise _bad_header(file, f"is not valid JSON: {e.msg} (at character {e.pos})") from None
    except ValueError:  # Python refuses to convert integers of over 4300 digits
        raise _bad_header(file, "is not valid JSON: a number has too many digits") from None
    except RecursionError:
        raise _bad_header(file, "is not valid JSON: values are nested too deeply") from None


def _no_constants(file: str) -> Callable[[str], Any]:
    def hook(name: str) -> Any:
        raise _bad_header(file, f"is not valid JSON: {name} is not a JSON number")

    return hook


def _check_text(text: str, file: str, where: str) -> None:
    # Python's json accepts lone surrogates ("\ud800"); serde_json does not,
    # and they cannot be written back out as UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidCarton(file, f"{text!r} is not valid Unicode text", field=where) from None


def _metadata(value: Any, file: str) -> dict[str, str]:
    if value is None:  # serde reads null as "no metadata" too
        return {}
    if not isinstance(value, dict):
        raise InvalidCarton(file, f"must be an object, not {_json_type(value)}", field=METADATA_KEY)
    for key, text in value.items():
        where = join_field(METADATA_KEY, key)
        if not isinstance(text, str):
            raise InvalidCarton(file, f"must be a string, not {_json_type(text)}", field=where)
        _check_text(text, file, where)
    return value


def _tensor(name: str, info: Any, file: str) -> SafetensorsTensor:
    where = f"tensor {name!r}"
    if not isinstance(info, dict):
        raise InvalidCarton(file, f"must be an object, not {_json_type(info)}", field=where)
    for key in _TENSOR_FIELDS:
        if key not in info:
            raise InvalidCarton(file, "is required but missing", field=f"{where}.{key}")
    for key in info:
        if key not in _TENSOR_FIELDS:
            raise InvalidCarton(
                file,
                "is not a tensor field (only dtype, shape and data_offsets)",
                field=f"{where}.{key}",
            )
    dtype = _dtype(info["dtype"], file, f"{where}.dtype")
    shape = _u64_list(info["shape"], file, f"{where}.shape")
    begin, end = _offsets(info["data_offsets"], file, f"{where}.data_offsets")
    _check_size(dtype, shape, end - begin, file, f"{where}.data_offsets")
    return SafetensorsTensor(name=name, dtype=dtype, shape=shape, begin=begin, end=end)


def _dtype(value: Any, file: str, where: str) -> str:
    if not isinstance(value, str) or value not in SAFETENSORS_DTYPE_BITS:
        known = ", ".join(SAFETENSORS_DTYPE_BITS)
        shown = repr(value) if isinstance(value, str) else _json_type(value)
        raise InvalidCarton(file, f"{shown} is not a safetensors dtype ({known})", field=where)
    return value


def _u64_list(value: Any, file: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        problem = f"must be a list of integers, not {_json_type(value)}"
        raise InvalidCarton(file, problem, field=where)
    for i, item in enumerate(value):
        if not is_int(item) or not 0 <= item <= _U64_MAX:
            shown = item if is_int(item) else _json_type(item)
            raise InvalidCarton(
                file, f"must be a non-negative 64-bit integer, not {shown}", field=f"{where}[{i}]"
            )
    return tuple(value)


def _offsets(value: Any, file: str, where: str) -> tuple[int, int]:
    offsets = _u64_list(value, file, where)
    if len(offsets) != 2:
        raise InvalidCarton(file, f"must be [begin, end], not {len(offsets)} numbers", field=where)
    begin, end = offsets
    if begin > end:
        raise InvalidCarton(file, f"begins at {begin}, after its end {end}", field=where)
    return begin, end


def _check_size(dtype: str, shape: Sequence[int], size: int, file: str, where: str) -> None:
    count = math.prod(shape)
    bits = count * SAFETENSORS_DTYPE_BITS[dtype]
    if bits % 8:
        problem = f"{count} {dtype} elements do not fill a whole number of bytes"
        raise InvalidCarton(file, problem, field=where)
    if size != bits // 8:
        raise InvalidCarton(
            file,
            f"spans {size} bytes, but a {dtype} tensor of shape {list(shape)} takes {bits // 8}",
            field=where,
        )


def _check_layout(tensors: list[SafetensorsTensor], data_len: int, file: str) -> None:
    """Tensors, sorted by offset, tile the data buffer exactly."""
    position = 0
    previous: SafetensorsTensor | None = None
    for tensor in tensors:
        where = f"tensor {tensor.name!r}.data_offsets"
        if tensor.begin > position:
            raise InvalidCarton(
                file,
                f"starts at {tensor.begin}, leaving bytes {position}..{tensor.begin} "
                "of the data to no tensor (holes are not allowed)",
                field=where,
            )
        if tensor.begin < position and previous is not None:
            raise InvalidCarton(
                file,
                f"starts at {tensor.begin}, inside tensor {previous.name!r} "
                f"({previous.begin}..{previous.end})",
                field=where,
            )
        if tensor.end > data_len:
            problem = f"ends at {tensor.end}, past the end of the data ({data_len} bytes)"
            raise InvalidCarton(file, problem, field=where)
        position, previous = tensor.end, tensor
    if position != data_len:
        raise InvalidCarton(
            file, f"has {data_len - position} bytes after the last tensor that belong to no tensor"
        )


def _json_type(value: Any) -> str:
    names = {"a table": "an object", "an array": "an array", "null": "null"}
    name = type_name(value)
    return names.get(name, name)
