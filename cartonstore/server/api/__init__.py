"""The daemon's HTTP API on aiohttp, one of the daemon's three doors (with
the native front, server/http/, and gRPC, server/rpc/; it imports neither):
app.py (``build_app``: the application, its middleware and the repository,
health, metadata and lease routes); a module per group of routes:
infer.py (over the inference core, server/inference/), model_info.py,
shm.py, cuda_shm.py, examples.py, selftest.py, blobs.py (/v1/blobs for
peers); context.py (what routes share: the application's keys, request
readers), bodies.py (request bodies as aiohttp reads them) and
responses.py (error answers).
"""
