"""KServe v2 (Triton) protocol codecs shared by the daemon, the runner SDK
and the client: datatypes, the binary tensor data extension, request
validation against a carton's declared tensors, and the HTTP/1.1 heads
the REST protocol travels in (http1.py: the daemon's front and the runner's
server parse with it).

Everything here is pure: bytes and numpy arrays in, bytes and numpy arrays
out, no I/O.
"""

from __future__ import annotations
