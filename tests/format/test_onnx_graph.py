"""ONNX graph signatures (format/onnx_graph.py): graphs built with the onnx
package read as onnxruntime's session reads them (get_inputs(),
get_outputs()), the weights never read; hostile files, built by hand on
the protobuf wire format, refused by name and byte offset."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
import pytest
from kit.modelfiles import protobuf_field as _field
from kit.modelfiles import protobuf_varint as _varint
from onnx import TensorProto, helper, numpy_helper

from cartonstore.errors import InvalidCarton
from cartonstore.format.dtypes import ONNX_TO_CARTON
from cartonstore.format.onnx_graph import (
    MAX_DIMS,
    MAX_FIELDS,
    MAX_KEPT_TEXT,
    MAX_TEXT,
    MAX_TYPE_NESTING,
    MAX_VALUES,
    OnnxValue,
    parse_onnx_graph,
    parse_onnx_graph_bytes,
)

FILE = "model/m.onnx"
_CODES = {f"tensor({name.lower()})": code for name, code in TensorProto.DataType.items()}


def _model(graph: onnx.GraphProto, *, ir_version: int = 8, opsets: tuple[tuple[str, int], ...] = (("", 13),)) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = ir_version
    return model.SerializeToString()


def _session(model: bytes | Path) -> tuple[list[tuple[str, str, tuple[Any, ...]]], ...]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3   # an initializer listed as an input is warned about
    session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    return tuple([(a.name, a.type, tuple(a.shape)) for a in args] for args in (session.get_inputs(),
                                                                             session.get_outputs()))


def _parsed(model: bytes) -> tuple[list[tuple[str, str, tuple[Any, ...]]], ...]:
    graph = parse_onnx_graph_bytes(model, file=FILE)
    return tuple([(v.name, v.type, v.shape) for v in values] for values in (graph.inputs, graph.outputs))


def _identities(values: list[onnx.ValueInfoProto]) -> onnx.GraphProto:
    """Each input passed to an output of its own type: onnxruntime infers nothing the graph does not say."""
    outs = [onnx.ValueInfoProto() for _ in values]
    for value, out in zip(values, outs, strict=True):
        out.CopyFrom(value)
        out.name = f"{value.name}_out"
    return helper.make_graph([helper.make_node("Identity", [v.name], [o.name]) for v, o in zip(values, outs,
                                                                                              strict=True)],
                             "identities", values, outs)


def test_every_carton_dtype_and_every_kind_of_dimension_reads_as_onnxruntime_reads_it() -> None:
    shapes: list[Any] = [["N", 4], [None, 3], ["batch", None, 2], [], None]
    values = [helper.make_tensor_value_info(f"in_{i}", _CODES[name], shapes[i % len(shapes)])
              for i, name in enumerate(ONNX_TO_CARTON)]
    model = _model(_identities(values))
    assert _parsed(model) == _session(model)
    graph = parse_onnx_graph_bytes(model, file=FILE)
    assert graph.ir_version == 8 and graph.opset_imports == (("", 13),)
    assert graph.inputs[0] == OnnxValue("in_0", "tensor(float)", ("N", 4))
    assert {v.type for v in graph.inputs} == set(ONNX_TO_CARTON)


@pytest.mark.parametrize("ir_version", [3, 8])
def test_inputs_an_initializer_or_sparse_initializer_backs_are_left_out_as_onnxruntime_does(ir_version: int) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    sparse = helper.make_sparse_tensor(helper.make_tensor("s", TensorProto.FLOAT, [1], [5.0]),
                                       helper.make_tensor("s_at", TensorProto.INT64, [1], [2]), [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "s"], ["y"])],
                              "g", [x, w, s], [y], [helper.make_tensor("w", TensorProto.FLOAT, [4], [1, 2, 3, 4])],
                              sparse_initializer=[sparse])
    model = _model(graph, ir_version=ir_version, opsets=(("", 11),))
    assert _parsed(model) == _session(model) == ([("x", "tensor(float)", ("N", 4))], [("y", "tensor(float)", ("N", 4))])


def test_a_model_given_in_two_parts_merges_as_protobuf_merges_them() -> None:
    first = _model(_identities([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])]))
    second = helper.make_model(_identities([helper.make_tensor_value_info("z", TensorProto.INT64, [2])]),
                               opset_imports=[])
    merged = first + second.SerializeToString()   # two messages one after the other are their merge
    assert _parsed(merged) == _session(merged)
    assert [name for name, _, _ in _parsed(merged)[0]] == ["x", "z"]


def test_types_that_are_not_tensors_are_named_as_onnxruntime_names_them() -> None:
    probabilities = helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 3])
    zipmap = helper.make_node("ZipMap", ["p"], ["z"], domain="ai.onnx.ml", classlabels_int64s=[1, 2, 3])
    sequence = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    z = helper.make_value_info("z", helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))
    graph = helper.make_graph([zipmap, helper.make_node("SequenceLength", ["s"], ["n"])], "g",
                              [probabilities, sequence], [z, helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    model = _model(graph, opsets=(("", 13), ("ai.onnx.ml", 1)))
    parsed, ort = _parsed(model), _session(model)
    assert [(n, t) for n, t, _ in parsed[0] + parsed[1]] == [(n, t) for n, t, _ in ort[0] + ort[1]]
    assert parsed[1][0][1] == "seq(map(int64,tensor(float)))"
    assert parse_onnx_graph_bytes(model, file=FILE).opset_imports == (("", 13), ("ai.onnx.ml", 1))


def test_external_data_is_not_read(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256])
    weights = numpy_helper.from_array(np.ones(256, np.float32), "w")
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [weights]),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.weights", size_threshold=0)
    assert _session(tmp_path / "m.onnx") == _parsed((tmp_path / "m.onnx").read_bytes())
    (tmp_path / "m.weights").unlink()
    assert _parsed((tmp_path / "m.onnx").read_bytes())[0] == [("x", "tensor(float)", ("N", 256))]


class _CountingFile:
    """A file whose reads are counted."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.bytes_read = 0

    def read_at(self, offset: int, size: int) -> bytes:
        self._file.seek(offset)
        data = self._file.read(size)
        self.bytes_read += len(data)
        return data


def test_a_64_mib_initializer_is_never_read(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1 << 24])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1 << 24])
    weights = numpy_helper.from_array(np.zeros(1 << 24, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [weights])
    path = tmp_path / "big.onnx"
    path.write_bytes(_model(graph))
    with path.open("rb") as f:
        file = _CountingFile(f)
        graph_read = parse_onnx_graph(file.read_at, path.stat().st_size, file=FILE)
    assert file.bytes_read < 64 << 10
    assert ([(v.name, v.type, v.shape) for v in graph_read.inputs], [(v.name, v.type, v.shape) for v in
                                                                      graph_read.outputs]) == _session(path)


# -- hostile files, built by hand on the wire format ---------------------------

def _value(name: bytes, type_proto: bytes) -> bytes:
    return _field(1, name) + _field(2, type_proto)


def _tensor_type(elem: int = 1, dims: bytes = b"") -> bytes:
    return _field(1, _field(1, elem) + _field(2, dims))


def _wire_model(graph: bytes) -> bytes:
    return _field(1, 8) + _field(8, _field(2, 13)) + _field(7, graph)


def _refused(data: bytes, field: str, *problem: str, at_byte: bool = True) -> None:
    with pytest.raises(InvalidCarton) as caught:
        parse_onnx_graph_bytes(data, file=FILE)
    assert caught.value.file == FILE and caught.value.field == field, caught.value
    assert all(p in caught.value.problem for p in problem), caught.value
    assert ("(at byte " in caught.value.problem) == at_byte, caught.value


GOOD = _wire_model(_field(11, _value(b"x", _tensor_type(1, _field(1, _field(2, b"N"))))) +
                   _field(12, _value(b"y", _tensor_type(1, _field(1, _field(1, 4))))))


def test_the_hand_built_model_reads() -> None:
    assert _parsed(GOOD) == ([("x", "tensor(float)", ("N",))], [("y", "tensor(float)", (4,))])


def test_a_oneof_keeps_the_member_given_last_as_protobufs_own_parser_does() -> None:
    dims = _field(1, _field(2, b"N") + _field(1, 7))        # dim_param, then dim_value
    kind = _field(4, _field(1, _tensor_type())) + _tensor_type(6, dims)   # a sequence, then a tensor
    data = _wire_model(_field(11, _value(b"x", kind)))
    reference = onnx.ModelProto.FromString(data).graph.input[0].type
    assert reference.WhichOneof("value") == "tensor_type" and reference.tensor_type.shape.dim[0].dim_value == 7
    assert _parsed(data)[0] == [("x", "tensor(int32)", (7,))]


def test_a_truncated_file_and_a_length_past_its_end_are_refused() -> None:
    _refused(GOOD[:-3], "graph", "runs past the end of the file")
    head = _field(1, 8) + _varint(7 << 3 | 2) + _varint(1 << 40)
    _refused(head + b"\0" * 10, "graph", f"a message of {1 << 40} bytes runs past the end of the file (")
    inner = _field(7, _field(11, _varint(1 << 3 | 2) + _varint(100) + b"x"))
    _refused(_field(1, 8) + inner + _field(2, b"producer"), "graph.input[0].name", "runs past the end of its message")


def test_a_file_shorter_than_its_size_is_refused() -> None:
    with pytest.raises(InvalidCarton, match=r"the file ends at byte \d+, before its"):
        parse_onnx_graph(lambda offset, size: GOOD[offset:offset + size][:4], len(GOOD), file=FILE)


def test_a_varint_of_11_bytes_is_refused() -> None:
    _refused(_varint(1 << 3) + b"\xff" * 10 + b"\x01", "ir_version", "a varint longer than 10 bytes", "at byte 1")


def test_wrong_wire_types_and_groups_are_refused_by_name() -> None:
    _refused(_field(1, 8) + _field(7, 5), "graph", "has wire type 0 (varint); a message is wire type 2")
    _refused(_field(1, b"8") + _field(7, b""), "ir_version", "an int64 is wire type 0")
    bad_elem = _wire_model(_field(11, _value(b"x", _field(1, _field(1, b"\x01")))))
    _refused(bad_elem, "graph.input[0].type.tensor_type.elem_type", "an int32 is wire type 0")
    _refused(_field(1, 8) + _varint(5 << 3 | 3), "model", "field 5 is a group (wire type 3)")
    _refused(b"not a graph", "model", "is not a field key", "wire type 6")


def test_a_type_nesting_bomb_is_refused() -> None:
    bomb = _tensor_type()
    for _ in range(2000):
        bomb = _field(4, _field(1, bomb))   # a sequence of a sequence of ...
    where = "graph.input[0].type" + ".sequence_type.elem_type" * MAX_TYPE_NESTING
    _refused(_wire_model(_field(11, _value(b"x", bomb))), where, f"types nest more than {MAX_TYPE_NESTING} deep")


def test_huge_repeated_counts_are_refused() -> None:
    many = _field(11, _value(b"", _tensor_type())) * 2   # one input given twice
    _refused(_wire_model(many), "graph.input[1]", "input '' is given twice")
    values = b"".join(_field(11, _value(b"x%d" % i, _tensor_type())) for i in range(MAX_VALUES + 1))
    _refused(_wire_model(values), "graph.input", f"more than {MAX_VALUES} inputs and outputs")
    dims = _field(1, _field(1, 1)) * (MAX_DIMS + 1)
    _refused(_wire_model(_field(11, _value(b"x", _tensor_type(1, dims)))),
             f"graph.input[0].type.tensor_type.shape.dim[{MAX_DIMS}]", f"more than {MAX_DIMS} dimensions")
    _refused(_wire_model(_field(11, _value(b"x" * (MAX_TEXT + 1), _tensor_type()))), "graph.input[0].name",
             f"{MAX_TEXT + 1} bytes of text, over the {MAX_TEXT} read")
    names = b"".join(_field(11, _value(b"%d" % i + b"x" * (MAX_TEXT - 8), _tensor_type()))
                     for i in range(MAX_KEPT_TEXT // MAX_TEXT + 1))
    _refused(_wire_model(names), f"graph.input[{MAX_KEPT_TEXT // MAX_TEXT}].name",
             f"more than {MAX_KEPT_TEXT} bytes in all")


def test_a_file_of_more_fields_than_the_limit_is_refused() -> None:
    _refused(_field(1, 8) + _field(2, 0) * MAX_FIELDS, "model", f"more than {MAX_FIELDS} fields")


def test_missing_parts_and_bad_text_are_refused_by_name() -> None:
    _refused(_field(7, b""), "ir_version", "is missing: every ONNX model names its IR version", at_byte=False)
    _refused(_field(1, 8), "graph", "is missing: the model holds no graph", at_byte=False)
    _refused(_wire_model(_field(12, _field(1, b"y"))), "graph.output[0]", "'y' has no type")
    _refused(_wire_model(_field(12, _field(2, _tensor_type()))), "graph.output[0]", "has no name")
    _refused(_wire_model(_field(11, _value(b"\xff", _tensor_type()))), "graph.input[0].name", "is not UTF-8")


def test_a_hostile_file_at_every_limit_keeps_a_few_mib() -> None:
    name = b"n" * 48
    dims = _field(1, _field(2, b"d" * 16)) * (MAX_DIMS // MAX_VALUES)
    values = b"".join(_field(12, _value(name + b"%d" % i, _tensor_type(1, dims))) for i in range(MAX_VALUES))
    data = _wire_model(values)
    tracemalloc.start()
    try:
        graph = parse_onnx_graph_bytes(data, file=FILE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(graph.outputs) == MAX_VALUES
    assert peak < 8 << 20, peak
