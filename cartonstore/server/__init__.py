"""The daemon: one process per host serving the store over a Unix socket
(and optionally TCP), from the ground up:

- tensors/: the tensor arena (shared memory with runners) and Triton's
  shared-memory regions;
- checks/: the JSON check worker processes;
- runner_processes/: runner processes: start, sandbox, supervise, pool,
  the wire to them;
- models/: ``ModelService``, the model service (loading, leases, runtime
  state, runner plans, self-tests on load, the response cache, metrics, gc
  in a child);
- inference/: the one pipeline every door's infer goes through;
- calls/: what the doors share that is not inference;
- the doors, none importing another: api/ (the aiohttp routes), http/ (the
  HTTP/1.1 front), rpc/ (gRPC), mirror/ (the registry mirror);
- daemon.py: ``Daemon``, the wiring: sockets, start, stop.
"""

import os

# The daemon forks (runners before their exec, the gc's child) while grpcio's
# threads run: its fork handlers, on in grpcio's core unless this says no,
# then crash the child with SIGSEGV before its exec. No child of the daemon
# uses gRPC. grpcio reads this when it is first imported, which any module
# below may do (tritonclient.grpc's messages), so it is set here, first.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

