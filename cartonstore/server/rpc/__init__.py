"""The v2 gRPC service (inference.GRPCInferenceService, Triton's), over
grpcio's asyncio server: one of the daemon's three doors (with the native
HTTP front, server/http/, and the aiohttp routes, server/api/; it imports
neither), over the inference core (server/inference/) and server/calls/,
on a Unix socket beside the HTTP one and on [server] grpc_listen."""

import os

# The daemon forks (runners before their exec, the gc's child): grpcio's fork
# handlers would restart its event engine threads in each child, and that
# crashed runners with SIGSEGV before their exec. No child of the daemon uses
# gRPC, so the handlers are turned off; grpcio reads this when first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
