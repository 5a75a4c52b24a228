"""The v2 gRPC service (inference.GRPCInferenceService, Triton's), over
grpcio's asyncio server: a second framing of the HTTP API's inference
path, on a Unix socket beside the HTTP one and on [server] grpc_listen."""

import os

# The daemon forks (runners before their exec, the gc's child): grpcio's fork
# handlers would restart its event engine threads in each child, and that
# crashed runners with SIGSEGV before their exec. No child of the daemon uses
# gRPC, so the handlers are turned off; grpcio reads this when first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
