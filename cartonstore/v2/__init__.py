"""KServe v2 (Triton) protocol codecs shared by the daemon, the runner SDK
and the client: datatypes, the binary tensor data extension, and request
validation against a carton's declared tensors.

Everything here is pure: bytes and numpy arrays in, bytes and numpy arrays
out, no I/O.
"""

from __future__ import annotations
