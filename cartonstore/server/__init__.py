"""The daemon: one process per host serving the store over a Unix socket
(and optionally TCP), from the ground up:

- tensors/: what an infer request's tensors pass through: the tensor arena
  (shared memory with runners), Triton's shared-memory regions, request
  checks and the check worker processes;
- runners/: runner processes: start, supervise, pool, the wire to them;
- models/: ``ModelService``, the model service (loading, leases, runtime
  state, runner plans, self-tests on load, metrics, gc in a child);
- api/: the aiohttp routes (repository, infer, leases, shared memory,
  examples, self-tests, blobs, metrics) over the model service;
- http/: the HTTP/1.1 front that answers infer and lease requests itself and
  hands every other request to the aiohttp app;
- daemon.py: ``Daemon``, the wiring: sockets, start, stop.

Each subfolder imports only the ones above it in this list.
"""
