"""Model files as other tools write them, small: GGUF files by llama.cpp's
own writer (the ``gguf`` package), safetensors files by the format's layout
(8-byte size, JSON header, data), and protobuf fields by its wire format,
for ONNX files no writer would make."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path

SAFETENSORS_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1}


def gguf_file(path: Path, *, arch: str = "llama", name: str = "Tiny Llama", file_type: int = 1,
              tensors: Mapping[str, tuple[int, ...]] = {"token_embd.weight": (8, 16), "output_norm.weight": (8,)},
              context_length: int = 4096, vocabulary: int = 40) -> Path:
    """A GGUF file of ``arch`` with F32 tensors of these (numpy-order)
    shapes, a tokenizer vocabulary of ``vocabulary`` strings and the keys
    llama.cpp writes."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_context_length(context_length)
    writer.add_embedding_length(16)
    writer.add_block_count(2)
    writer.add_bool("tiny.tested", True)
    writer.add_token_list([f"tok{i}" for i in range(vocabulary)])
    writer.add_token_scores([float(i) for i in range(vocabulary)])
    for tensor_name, shape in tensors.items():
        writer.add_tensor(tensor_name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def safetensors_file(path: Path, tensors: Mapping[str, tuple[str, tuple[int, ...]]], *,
                     random: bool = False) -> Path:
    """A safetensors file of zero-filled tensors (name -> dtype, shape);
    ``random``: of random bytes, which no filesystem stores in fewer blocks."""
    header: dict[str, object] = {}
    offset = 0
    for tensor_name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * SAFETENSORS_BYTES[dtype]
        header[tensor_name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + (os.urandom(offset) if random else bytes(offset)))
    return path


def protobuf_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def protobuf_field(number: int, payload: bytes | int, wire_type: int | None = None) -> bytes:
    """Field ``number`` on the wire: a varint (wire type 0) for an int, a
    length-delimited field (2) for bytes, unless ``wire_type`` says otherwise."""
    if isinstance(payload, int):
        return protobuf_varint(number << 3 | (wire_type or 0)) + protobuf_varint(payload)
    return protobuf_varint(number << 3 | (2 if wire_type is None else wire_type)) + protobuf_varint(len(payload)) \
        + payload
