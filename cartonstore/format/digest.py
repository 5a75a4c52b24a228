"""What a sha256 digest looks like in a carton: 64 lowercase hex digits.

Its own module because the store checks digests when it opens (`path`,
`ls`) and must not load the MANIFEST parser to do it.
"""

from __future__ import annotations

import re

SHA256_RE = re.compile(r"[0-9a-f]{64}")


def is_sha256(s: object) -> bool:
    """True for a sha256 digest written as 64 lowercase hex digits."""
    return isinstance(s, str) and SHA256_RE.fullmatch(s) is not None
