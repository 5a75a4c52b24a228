"""What the daemon's three doors (the native HTTP front ``server/http/``,
the aiohttp routes ``server/api/``, gRPC ``server/rpc/``) do alike with a
call that is not inference: who may make it over TCP (access), its body
within the daemon's budget (bodies), how it ends (outcome: the answer to an
error, the counter and log line), the lease operations (leases) and
Triton's extensions beyond inference (extensions). Below the inference core
and the doors; imports no aiohttp, no grpc, no door.
"""
