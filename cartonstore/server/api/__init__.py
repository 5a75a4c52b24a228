"""The daemon's HTTP API on aiohttp, a thin layer over the model service:
app.py (``build_app``: the application, its middleware and the repository,
health and metadata routes); a module per group of routes: infer.py,
leases.py, shm.py, examples.py, selftest.py, blobs.py (/v1/blobs for
peers); context.py (what routes share: the application's keys, request
readers), bodies.py (request bodies, any Content-Encoding) and responses.py
(error answers).
"""
