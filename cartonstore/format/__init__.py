"""Pure parsing and validation of the carton v1 formats.

Bytes in, frozen dataclasses (or numpy arrays) out; no file or network I/O.
Every problem with the input raises cartonstore.errors.InvalidCarton naming
the file inside the carton, the field or line, and what is wrong.
"""

from cartonstore.format.carton_toml import (
    CartonConfig,
    Example,
    RunnerInfo,
    SelfTest,
    TensorSpec,
    check_references,
    parse_carton_toml,
)
from cartonstore.format.dtypes import (
    CARTON_DTYPES,
    SAFETENSORS_DTYPE_BITS,
    carton_dtype_to_v2,
    carton_numpy_dtype,
    is_numeric_carton_dtype,
    safetensors_dtype_to_v2,
    shape_to_v2_dims,
)
from cartonstore.format.links import build_links, parse_links
from cartonstore.format.manifest import Manifest, build_manifest, is_sha256, parse_manifest
from cartonstore.format.paths import (
    carton_path_problem,
    is_valid_carton_path,
    is_within,
    resolve_symlink_target,
    validate_carton_path,
)
from cartonstore.format.safetensors import (
    SAFETENSORS_HEADER_LIMIT,
    SafetensorsHeader,
    SafetensorsTensor,
    parse_header_size,
    parse_safetensors,
    parse_safetensors_header,
)
from cartonstore.format.tensor_data import (
    TensorEntry,
    check_tensor_files,
    check_tensor_index_present,
    decode_numeric,
    decode_string,
    expected_bin_size,
    load_tensors,
    parse_tensor_index,
)

__all__ = [
    "CARTON_DTYPES",
    "SAFETENSORS_DTYPE_BITS",
    "SAFETENSORS_HEADER_LIMIT",
    "CartonConfig",
    "Example",
    "Manifest",
    "RunnerInfo",
    "SafetensorsHeader",
    "SafetensorsTensor",
    "SelfTest",
    "TensorEntry",
    "TensorSpec",
    "build_links",
    "build_manifest",
    "carton_dtype_to_v2",
    "carton_numpy_dtype",
    "carton_path_problem",
    "check_references",
    "check_tensor_files",
    "check_tensor_index_present",
    "decode_numeric",
    "decode_string",
    "expected_bin_size",
    "is_numeric_carton_dtype",
    "is_sha256",
    "is_valid_carton_path",
    "is_within",
    "load_tensors",
    "parse_carton_toml",
    "parse_header_size",
    "parse_links",
    "parse_manifest",
    "parse_safetensors",
    "parse_safetensors_header",
    "parse_tensor_index",
    "resolve_symlink_target",
    "safetensors_dtype_to_v2",
    "shape_to_v2_dims",
    "validate_carton_path",
]
