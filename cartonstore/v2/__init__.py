"""KServe v2 (Triton) protocol codecs shared by the daemon, the runner SDK
and the client: datatypes, the binary tensor data extension, request
validation against a carton's declared tensors, and the HTTP/1.1 messages
the REST protocol travels in (http1.py, on llhttp: the daemon's front, its
runner client and the runner's server read heads and chunked bodies with it).

Everything here is pure: bytes and numpy arrays in, bytes and numpy arrays
out, no I/O.
"""

from __future__ import annotations
