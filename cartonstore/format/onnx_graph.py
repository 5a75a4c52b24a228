"""ONNX graph signatures: a model's inputs and outputs, each with its name,
element type and shape, read from the protobuf wire format of onnx.proto
without onnxruntime and without reading the weights.

A model file is one ModelProto (proto2): ir_version = 1, opset_import = 8
(OperatorSetIdProto: domain = 1, version = 2), graph = 7. Of the GraphProto
this reads input = 11 and output = 12 (ValueInfoProto: name = 1, type = 2)
and the names of initializer = 5 (TensorProto.name = 8) and
sparse_initializer = 15 (SparseTensorProto.values = 1, a TensorProto): an
input named like an initializer is a weight a caller may override, which
onnxruntime's get_inputs() leaves out, as this does. A TypeProto is a
oneof: tensor_type = 1 (elem_type = 1, shape = 2), sequence_type = 4
(elem_type = 1), map_type = 5 (key_type = 1, value_type = 2),
optional_type = 9 (elem_type = 1), sparse_tensor_type = 8 (as a tensor's),
opaque_type = 7 (domain = 1, name = 2). A TensorShapeProto is dim = 1, each
a Dimension with dim_value = 1 or dim_param = 2 (a oneof) or neither.

Protobuf's rules hold: fields come in any order and unknown ones are
skipped; a message field given twice merges (repeated fields add up, the
last scalar counts); a oneof keeps the member given last. The fields read
must have their wire type; groups (wire types 3 and 4), which ONNX never
writes, are refused. Everything else (nodes, weights inline or external,
metadata) is passed by its length without being read, so a 2 GB graph with
its weights inline costs the reads of its field headers: the file is read
through ``read_at(offset, size)`` (the caller's I/O) in windows of at most
64 KiB, small again after each skip. Every length is checked against its
message and the file, and the limits below bound what a hostile file can
make this keep or do; each problem raises InvalidCarton naming the field
and its byte offset.

Types are named as onnxruntime names them ("tensor(float)",
"seq(map(int64,tensor(float)))"), shapes as its NodeArg.shape does: an int
per dim_value, a str per dim_param, None for neither, () where the graph
gives no shape. An output's type and shape are the ones the graph declares:
onnxruntime also infers what a graph leaves out, this does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from cartonstore.errors import InvalidCarton

from .dtypes import ONNX_ELEM_TYPE_NAMES
from .read_at import ReadAt, read_at_bytes

MAX_FIELDS = 1 << 20
"""Field headers read in all (a graph of 100,000 nodes takes some 300,000):
a second or two of work at most, whatever the file."""
MAX_VALUES = 1 << 13
"""Inputs and outputs together (older models list every weight as an input:
some hundreds)."""
MAX_DIMS = 1 << 15
"""Dimensions of all inputs and outputs together."""
MAX_OPSETS = 1 << 10
MAX_TEXT = 1 << 12
"""Bytes of one name, dim_param or domain kept."""
MAX_KEPT_TEXT = 1 << 20
"""Bytes of all the names, dim_params and domains kept."""
MAX_TYPE_NESTING = 8
"""Types inside types (a sequence of maps of tensors is 3)."""
MAX_GRAPH_PARTS = 16
"""Times ModelProto.graph may be given (the parts merge; writers give it once)."""

_FIRST_READ = 512
_WINDOW = 1 << 16
_U64 = (1 << 64) - 1
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_WIRE_TYPES = {_VARINT: "varint", _I64: "64-bit", _LEN: "length-delimited", 3: "group start", 4: "group end",
               _I32: "32-bit"}
_READ_WIRE_TYPES = frozenset((_VARINT, _I64, _LEN, _I32))
_TYPE_MEMBERS = {1: "tensor", 4: "seq", 5: "map", 9: "optional", 8: "sparse_tensor", 7: "opaque"}
"""TypeProto's oneof: field number -> the kind, as onnxruntime's type names begin."""
_MEMBER_PARTS = {
    ("tensor", 1): ("elem_type", "elem_type"), ("tensor", 2): ("shape", "dims"),
    ("sparse_tensor", 1): ("elem_type", "elem_type"), ("sparse_tensor", 2): ("shape", "dims"),
    ("map", 1): ("key_type", "elem_type"), ("map", 2): ("value_type", "inner"),
    ("seq", 1): ("elem_type", "inner"), ("optional", 1): ("elem_type", "inner"),
    ("opaque", 1): ("domain", "domain"), ("opaque", 2): ("name", "name"),
}
"""(kind, field number) of a TypeProto member -> the field's name and the _Type part it sets."""
_MEMBER_FIELDS = {"tensor": "tensor_type", "seq": "sequence_type", "map": "map_type", "optional": "optional_type",
                  "sparse_tensor": "sparse_tensor_type", "opaque": "opaque_type"}


@dataclass(frozen=True)
class OnnxValue:
    """A graph input or output, as onnxruntime's NodeArg shows it."""

    name: str
    type: str
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class OnnxGraph:
    ir_version: int
    opset_imports: tuple[tuple[str, int | None], ...]
    """(domain, version) of each opset_import; "" is the default ONNX domain."""
    inputs: tuple[OnnxValue, ...]
    """The graph's inputs less those an initializer backs, in the graph's order."""
    outputs: tuple[OnnxValue, ...]


def parse_onnx_graph(read_at: ReadAt, file_size: int, *, file: str) -> OnnxGraph:
    """The signature of the ``file_size``-byte ONNX model ``file`` (named in
    errors), read through ``read_at``. Raises InvalidCarton naming the field
    and byte offset at fault: a length past its message or the file, a
    varint over 10 bytes, a wire type the field cannot have, text that is
    not UTF-8, no ir_version or no graph, an input or output with no name or
    no type, a name given twice, a limit passed."""
    wire = _Wire(read_at, file_size, file)
    ir_version: int | None = None
    opsets: list[tuple[str, int | None]] = []
    graphs: list[tuple[int, int] | None] = []
    values = _Values()
    for number, wire_type, at in wire.fields(file_size, "model"):
        if number == 1:
            ir_version = wire.int64(wire_type, file_size, "ir_version", at)
        elif number == 8:
            if len(opsets) >= MAX_OPSETS:
                raise wire.problem(f"more than {MAX_OPSETS} opset imports", "opset_import", at)
            opsets.append(_opset(wire, wire.message_end(wire_type, file_size, "opset_import", at),
                                 f"opset_import[{len(opsets)}]"))
        elif number == 7:
            if len(graphs) >= MAX_GRAPH_PARTS:
                raise wire.problem(f"given more than {MAX_GRAPH_PARTS} times", "graph", at)
            initializers = _graph_values(wire, wire.message_end(wire_type, file_size, "graph", at), values)
            graphs.append(initializers)
        else:
            wire.skip(wire_type, file_size, "model", at)
    if ir_version is None:
        raise InvalidCarton(file, "is missing: every ONNX model names its IR version (is this an ONNX model?)",
                            field="ir_version")
    if not graphs:
        raise InvalidCarton(file, "is missing: the model holds no graph", field="graph")
    backed = _initialized(wire, graphs, {name.encode() for name in values.inputs}) if values.inputs else set()
    return OnnxGraph(ir_version, tuple(opsets),
                     tuple(v for name, v in values.inputs.items() if name.encode() not in backed),
                     tuple(values.outputs.values()))


def parse_onnx_graph_bytes(data: bytes, *, file: str) -> OnnxGraph:
    """The signature of an ONNX model held in memory."""
    return parse_onnx_graph(read_at_bytes(data), len(data), file=file)


class _Values:
    """The inputs and outputs read so far, each name once."""

    def __init__(self) -> None:
        self.inputs: dict[str, OnnxValue] = {}
        self.outputs: dict[str, OnnxValue] = {}

    def add(self, wire: _Wire, role: str, value: OnnxValue, where: str, at: int) -> None:
        kept = self.inputs if role == "input" else self.outputs
        if value.name in kept:
            raise wire.problem(f"{role} {value.name!r} is given twice", where, at)
        kept[value.name] = value


def _graph_values(wire: _Wire, end: int, values: _Values) -> tuple[int, int] | None:
    """GraphProto's inputs and outputs; every other field passed over.
    Returns the span from the first initializer (or sparse initializer) to
    the end of the last, for the second pass; None where it has none."""
    initializers: tuple[int, int] | None = None
    for number, wire_type, at in wire.fields(end, "graph"):
        if number not in (11, 12):
            wire.skip(wire_type, end, "graph", at)
            if number in (5, 15):
                initializers = (initializers[0] if initializers else at, wire.offset)
            continue
        role = "input" if number == 11 else "output"
        if len(values.inputs) + len(values.outputs) >= MAX_VALUES:
            raise wire.problem(f"more than {MAX_VALUES} inputs and outputs", f"graph.{role}", at)
        count = len(values.inputs if role == "input" else values.outputs)
        where = f"graph.{role}[{count}]"
        values.add(wire, role, _value_info(wire, wire.message_end(wire_type, end, where, at), where, at), where, at)
    return initializers


def _value_info(wire: _Wire, end: int, where: str, start: int) -> OnnxValue:
    name: str | None = None
    kind = _Type()
    for number, wire_type, at in wire.fields(end, where):
        if number == 1:
            name = wire.text(wire_type, end, f"{where}.name", at)
        elif number == 2:
            _type(wire, wire.message_end(wire_type, end, f"{where}.type", at), f"{where}.type", kind, 0)
        else:
            wire.skip(wire_type, end, where, at)
    if name is None:
        raise wire.problem("has no name", where, start)
    if kind.kind is None:
        raise wire.problem(f"{name!r} has no type (onnxruntime infers an output's, this does not: declare it)",
                           where, start)
    shape = tuple(kind.dims or ()) if kind.kind in ("tensor", "sparse_tensor") else ()
    return OnnxValue(name, kind.text(), shape)


class _Type:
    """A TypeProto as it is read: a message given twice merges into it."""

    def __init__(self) -> None:
        self.become(None)

    def become(self, kind: str | None) -> None:
        self.kind = kind
        self.elem_type = 0                        # a tensor's element, a map's key
        self.dims: list[int | str | None] | None = None   # None: no shape given
        self.inner: _Type | None = None           # a sequence's or optional's element, a map's value
        self.domain = self.name = ""              # an opaque type's

    def text(self) -> str:
        elem = ONNX_ELEM_TYPE_NAMES.get(self.elem_type, f"elem_type {self.elem_type}")
        inner = self.inner.text() if self.inner else "undefined"
        return {"tensor": f"tensor({elem})", "sparse_tensor": f"sparse_tensor({elem})", "seq": f"seq({inner})",
                "optional": f"optional({inner})", "map": f"map({elem},{inner})",
                "opaque": f"opaque({self.domain},{self.name})"}.get(self.kind or "", "undefined")


def _type(wire: _Wire, end: int, where: str, into: _Type, depth: int) -> None:
    if depth >= MAX_TYPE_NESTING:
        raise wire.problem(f"types nest more than {MAX_TYPE_NESTING} deep", where, wire.offset)
    for number, wire_type, at in wire.fields(end, where):
        kind = _TYPE_MEMBERS.get(number)
        if kind is None:
            wire.skip(wire_type, end, where, at)
            continue
        member = f"{where}.{_MEMBER_FIELDS[kind]}"
        member_end = wire.message_end(wire_type, end, member, at)
        if into.kind != kind:
            into.become(kind)
        _member(wire, member_end, member, into, depth)


def _member(wire: _Wire, end: int, where: str, into: _Type, depth: int) -> None:
    """TypeProto.Tensor, .SparseTensor, .Sequence, .Optional, .Map or .Opaque."""
    for number, wire_type, at in wire.fields(end, where):
        part = _MEMBER_PARTS.get((into.kind or "", number))
        if part is None:
            wire.skip(wire_type, end, where, at)
            continue
        field, holds = f"{where}.{part[0]}", part[1]
        if holds == "elem_type":
            into.elem_type = wire.int32(wire_type, end, field, at)
        elif holds == "dims":
            into.dims = into.dims if into.dims is not None else []
            _shape(wire, wire.message_end(wire_type, end, field, at), field, into.dims)
        elif holds == "inner":
            into.inner = into.inner or _Type()
            _type(wire, wire.message_end(wire_type, end, field, at), field, into.inner, depth + 1)
        else:
            setattr(into, holds, wire.text(wire_type, end, field, at))


def _shape(wire: _Wire, end: int, where: str, dims: list[int | str | None]) -> None:
    for number, wire_type, at in wire.fields(end, where):
        if number != 1:
            wire.skip(wire_type, end, where, at)
            continue
        field = f"{where}.dim[{len(dims)}]"
        wire.keep_dim(field, at)
        dims.append(_dimension(wire, wire.message_end(wire_type, end, field, at), field))


def _dimension(wire: _Wire, end: int, where: str) -> int | str | None:
    given = _scalars(wire, end, where, {1: ("dim_value", "int64"), 2: ("dim_param", "text")})
    return list(given.values())[-1] if given else None   # the oneof's member given last counts


def _opset(wire: _Wire, end: int, where: str) -> tuple[str, int | None]:
    given = _scalars(wire, end, where, {1: ("domain", "text"), 2: ("version", "int64")})
    version = given.get("version")
    return str(given.get("domain", "")), version if isinstance(version, int) else None


def _scalars(wire: _Wire, end: int, where: str, fields: dict[int, tuple[str, str]]) -> dict[str, int | str]:
    """The int64 and string fields (number -> name, "int64" or "text") of a
    small message, the last given of each, in the order they were last given."""
    given: dict[str, int | str] = {}
    for number, wire_type, at in wire.fields(end, where):
        if number not in fields:
            wire.skip(wire_type, end, where, at)
            continue
        name, kind = fields[number]
        given.pop(name, None)
        given[name] = wire.int64(wire_type, end, f"{where}.{name}", at) if kind == "int64" else \
            wire.text(wire_type, end, f"{where}.{name}", at)
    return given


def _initialized(wire: _Wire, graphs: list[tuple[int, int] | None], inputs: set[bytes]) -> set[bytes]:
    """The input names an initializer or sparse initializer also has: a
    second pass over the graph's initializers (writers put them together,
    after the nodes), keeping no name that is not an input's."""
    backed: set[bytes] = set()
    for start, end in filter(None, graphs):
        wire.offset = start
        for number, wire_type, at in wire.fields(end, "graph"):
            if number not in (5, 15):
                wire.skip(wire_type, end, "graph", at)
                continue
            field = "graph.initializer" if number == 5 else "graph.sparse_initializer"
            name = _tensor_name(wire, wire.message_end(wire_type, end, field, at), field, sparse=number == 15)
            if name in inputs:
                backed.add(name)
    return backed


def _tensor_name(wire: _Wire, end: int, where: str, *, sparse: bool) -> bytes | None:
    """TensorProto.name, or a SparseTensorProto's (its values tensor's);
    the tensor's data passed over."""
    name = None
    for number, wire_type, at in wire.fields(end, where):
        if sparse and number == 1:
            field = f"{where}.values"
            name = _tensor_name(wire, wire.message_end(wire_type, end, field, at), field, sparse=False) or name
        elif not sparse and number == 8:
            name = wire.name_bytes(wire_type, end, f"{where}.name", at)
        else:
            wire.skip(wire_type, end, where, at)
    return name


class _Wire:
    """The protobuf wire format of one file, front to back, each read
    checked against the end of the message it is in and the limits."""

    def __init__(self, read_at: ReadAt, file_size: int, file: str) -> None:
        self._read_at, self._file_size, self.file = read_at, file_size, file
        self.offset = 0
        self._window, self._window_at = b"", 0
        self._next_read = _FIRST_READ
        self._fields = self._dims = self._text = 0

    def problem(self, problem: str, where: str, at: int) -> InvalidCarton:
        return InvalidCarton(self.file, f"{problem} (at byte {at})", field=where)

    def _past(self, what: str, size: int, end: int, where: str, at: int) -> InvalidCarton:
        limit = f"the end of the file ({self._file_size} bytes)" if end == self._file_size else \
            f"the end of its message (byte {end})"
        return self.problem(f"{what} of {size} bytes runs past {limit}", where, at)

    def _bytes(self, size: int, where: str) -> tuple[bytes, int]:
        """The window holding the ``size`` bytes at the offset, and where they
        start in it; a read when it does not hold them, growing while the
        reads follow each other, small again after a skip."""
        start = self.offset - self._window_at
        if start >= 0 and start + size <= len(self._window):
            return self._window, start
        following = 0 <= start <= len(self._window)
        self._next_read = min(self._next_read * 2, _WINDOW) if following else _FIRST_READ
        want = min(max(size, self._next_read), self._file_size - self.offset)
        data = self._read_at(self.offset, want)
        if len(data) < size:
            raise self.problem(f"the file ends at byte {self.offset + len(data)}, before its "
                               f"{self._file_size} bytes", where, self.offset)
        self._window, self._window_at = data, self.offset
        return data, 0

    def _take(self, size: int, end: int, where: str, at: int) -> bytes:
        if size > end - self.offset:
            raise self._past("a field", size, end, where, at)
        data, start = self._bytes(size, where)
        self.offset += size
        return data[start:start + size]

    def _varint(self, end: int, where: str) -> int:
        at = self.offset
        start = at - self._window_at
        if at < end and 0 <= start < len(self._window) and self._window[start] < 0x80:
            self.offset = at + 1   # most varints are one byte: keys, lengths of names, element types
            return self._window[start]
        size = min(10, end - at)
        if size <= 0:
            raise self._past("a varint", 1, end, where, at)
        data, start = self._bytes(size, where)
        value = 0
        for i in range(size):
            byte = data[start + i]
            value |= (byte & 0x7F) << (7 * i)
            if byte < 0x80:
                self.offset = at + i + 1
                return value & _U64
        if size == 10:
            raise self.problem("a varint longer than 10 bytes", where, at)
        raise self._past("a varint", size + 1, end, where, at)

    def fields(self, end: int, where: str) -> Iterator[tuple[int, int, int]]:
        """(field number, wire type, byte offset) of each field of the message
        that ends at ``end``; the caller reads or skips each value."""
        while self.offset < end:
            at = self.offset
            self._fields += 1
            if self._fields > MAX_FIELDS:
                raise self.problem(f"more than {MAX_FIELDS} fields", where, at)
            start = at - self._window_at
            if 0 <= start < len(self._window) and self._window[start] < 0x80:   # the one-byte keys of fields 1 to 15
                key = self._window[start]
                self.offset = at + 1
            else:
                key = self._varint(end, where)
            number, wire_type = key >> 3, key & 7
            if wire_type not in _READ_WIRE_TYPES or not 0 < number < 1 << 29:
                raise self._bad_key(key, where, at)
            yield number, wire_type, at

    def _bad_key(self, key: int, where: str, at: int) -> InvalidCarton:
        number, wire_type = key >> 3, key & 7
        if 0 < number < 1 << 29 and wire_type in _WIRE_TYPES:
            return self.problem(f"field {number} is a group (wire type {wire_type}), which ONNX never writes",
                                where, at)
        return self.problem(f"{key:#x} is not a field key (number {number}, wire type {wire_type})", where, at)

    def skip(self, wire_type: int, end: int, where: str, at: int) -> None:
        """Past a field's value, reading no more than its length."""
        if wire_type == _VARINT:
            self._varint(end, where)
            return
        size = self._varint(end, where) if wire_type == _LEN else 8 if wire_type == _I64 else 4
        if size > end - self.offset:
            raise self._past("a field", size, end, where, at)
        self.offset += size

    def _advance(self, size: int, end: int, where: str, at: int) -> None:
        if size > end - self.offset:
            raise self._past("a field", size, end, where, at)
        self.offset += size

    def _expect(self, wire_type: int, want: int, what: str, where: str, at: int) -> None:
        if wire_type != want:
            raise self.problem(f"has wire type {wire_type} ({_WIRE_TYPES[wire_type]}); {what} is wire type {want} "
                               f"({_WIRE_TYPES[want]})", where, at)

    def message_end(self, wire_type: int, end: int, where: str, at: int) -> int:
        """Where the embedded message that starts here ends."""
        self._expect(wire_type, _LEN, "a message", where, at)
        size = self._varint(end, where)
        if size > end - self.offset:
            raise self._past("a message", size, end, where, at)
        return self.offset + size

    def int64(self, wire_type: int, end: int, where: str, at: int) -> int:
        self._expect(wire_type, _VARINT, "an int64", where, at)
        value = self._varint(end, where)
        return value - (1 << 64) if value >> 63 else value

    def int32(self, wire_type: int, end: int, where: str, at: int) -> int:
        self._expect(wire_type, _VARINT, "an int32", where, at)
        value = self._varint(end, where) & 0xFFFFFFFF
        return value - (1 << 32) if value >> 31 else value

    def text(self, wire_type: int, end: int, where: str, at: int) -> str:
        """A string field kept: its bytes counted against the limits, UTF-8."""
        self._expect(wire_type, _LEN, "a string", where, at)
        size = self._varint(end, where)
        if size > MAX_TEXT:
            raise self.problem(f"{size} bytes of text, over the {MAX_TEXT} read", where, at)
        self._text += size
        if self._text > MAX_KEPT_TEXT:
            raise self.problem(f"names and dim_params of more than {MAX_KEPT_TEXT} bytes in all", where, at)
        raw = self._take(size, end, where, at)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.problem(f"is not UTF-8 text (bad byte at {e.start})", where, at) from None

    def name_bytes(self, wire_type: int, end: int, where: str, at: int) -> bytes | None:
        """A string field compared, not kept: None for one longer than any kept name."""
        self._expect(wire_type, _LEN, "a string", where, at)
        size = self._varint(end, where)
        if size > MAX_TEXT:
            self._advance(size, end, where, at)
            return None
        return self._take(size, end, where, at)

    def keep_dim(self, where: str, at: int) -> None:
        self._dims += 1
        if self._dims > MAX_DIMS:
            raise self.problem(f"more than {MAX_DIMS} dimensions in all", where, at)
