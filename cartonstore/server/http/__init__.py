"""The daemon's HTTP/1.1 front, one of its three doors (with the aiohttp
routes, server/api/, and gRPC, server/rpc/; it imports neither):
listeners.py (``FrontServer``: the listening sockets and their
connections), connection.py (``FrontConnection``: one client connection,
its infer and lease requests answered here, over the inference core and
server/calls/; routes.py says which), relay.py (every other request
handed to aiohttp, whose server the daemon gives it) and event_loop.py
(uvloop when installed). Request and response heads are
cartonstore.v2.http1's, shared with the runner SDK's server.
"""
