"""Pure parsing and validation of the carton v1 formats.

Bytes in, frozen dataclasses (or numpy arrays) out; no file or network I/O.
Every problem with the input raises cartonstore.errors.InvalidCarton naming
the file inside the carton, the field or line, and what is wrong.
"""

from typing import TYPE_CHECKING

from cartonstore.system.lazy_names import lazy_names

# Each name is imported from its module on first use (PEP 562): a caller that
# needs one module (the store: manifest.is_sha256) must not load every parser
# with it, so that `cartonstore path` and `ls` start fast.
_MODULE_NAMES = {
    "carton_toml": "CartonConfig Example RunnerInfo SelfTest TensorSpec check_references parse_carton_toml",
    "dtypes": "CARTON_DTYPES CARTON_TO_V2 SAFETENSORS_DTYPE_BITS V2_TO_CARTON carton_dtype_to_v2 "
              "carton_numpy_dtype is_numeric_carton_dtype safetensors_dtype_to_v2 shape_to_v2_dims "
              "v2_to_carton_dtype",
    "links": "build_links parse_links",
    "digest": "is_sha256",
    "gguf": "GGUFHeader parse_gguf parse_gguf_bytes",
    "manifest": "Manifest build_manifest parse_manifest",
    "onnx_graph": "OnnxGraph OnnxValue parse_onnx_graph parse_onnx_graph_bytes",
    "paths": "carton_path_problem is_valid_carton_path is_within resolve_symlink_target validate_carton_path",
    "safetensors": "SAFETENSORS_HEADER_LIMIT SafetensorsHeader SafetensorsTensor parse_header_size "
                   "parse_safetensors parse_safetensors_header",
    "strict_json": "RepeatedKey unique_keys",
    "tensor_data": "TensorEntry check_tensor_files check_tensor_index_present decode_numeric decode_string "
                   "expected_bin_size load_tensors parse_tensor_index",
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _MODULE_NAMES)

if TYPE_CHECKING:  # what mypy sees; lazy_names imports these at run time
    from .carton_toml import (
        CartonConfig,
        Example,
        RunnerInfo,
        SelfTest,
        TensorSpec,
        check_references,
        parse_carton_toml,
    )
    from .digest import is_sha256
    from .dtypes import (
        CARTON_DTYPES,
        CARTON_TO_V2,
        SAFETENSORS_DTYPE_BITS,
        V2_TO_CARTON,
        carton_dtype_to_v2,
        carton_numpy_dtype,
        is_numeric_carton_dtype,
        safetensors_dtype_to_v2,
        shape_to_v2_dims,
        v2_to_carton_dtype,
    )
    from .gguf import GGUFHeader, parse_gguf, parse_gguf_bytes
    from .links import build_links, parse_links
    from .manifest import Manifest, build_manifest, parse_manifest
    from .onnx_graph import OnnxGraph, OnnxValue, parse_onnx_graph, parse_onnx_graph_bytes
    from .paths import (
        carton_path_problem,
        is_valid_carton_path,
        is_within,
        resolve_symlink_target,
        validate_carton_path,
    )
    from .safetensors import (
        SAFETENSORS_HEADER_LIMIT,
        SafetensorsHeader,
        SafetensorsTensor,
        parse_header_size,
        parse_safetensors,
        parse_safetensors_header,
    )
    from .strict_json import RepeatedKey, unique_keys
    from .tensor_data import (
        TensorEntry,
        check_tensor_files,
        check_tensor_index_present,
        decode_numeric,
        decode_string,
        expected_bin_size,
        load_tensors,
        parse_tensor_index,
    )
