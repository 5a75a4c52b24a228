"""The daemon's HTTP/1.1 front, above the API: front_server.py
(``FrontServer``: the listening sockets and their connections), front.py
(``FrontConnection``: infer and lease requests answered here, routes.py
says which), front_parts.py (what both share), relay.py (every other request handed to the aiohttp app)
and event_loop.py (uvloop when installed). Request and response heads are
cartonstore.v2.http1's, shared with the runner SDK's server.
"""
