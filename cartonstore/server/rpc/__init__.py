"""The v2 gRPC service (inference.GRPCInferenceService, Triton's), over
grpcio's asyncio server: one of the daemon's three doors (with the native
HTTP front, server/http/, and the aiohttp routes, server/api/; it imports
neither), over the inference core (server/inference/) and server/calls/,
on a Unix socket beside the HTTP one and on [server] grpc_listen."""
