"""The CSI spec's csi.proto (v1.12.0, Apache-2.0) and the modules
grpcio-tools 1.76.0 generated from it (protobuf gencode 6.31.1, not newer
than the protobuf runtime); made, from the repository's root, by::

    python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \\
        cartonstore/csi/proto/csi.proto

Generated files: not edited, not linted, not type-checked (pyproject.toml).
"""
