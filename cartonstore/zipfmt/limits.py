"""How much a zip may declare before it is refused.

Its own module because the settings and the store carry these limits from
the start, and neither should load the zip reader and its codecs to do so
(`cartonstore path` must start fast).
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
TiB = 1 << 40


@dataclass(frozen=True)
class ZipLimits:
    """What a zip may declare before we refuse to read it.

    ``ratio_floor`` exempts entries smaller than it from the ratio check:
    small files of zeros legitimately compress far better than 1000:1, and
    they cannot do much harm anyway.
    """

    max_entries: int = 200_000
    max_ratio: int = 1000
    ratio_floor: int = 64 * MiB
    max_entry_size: int = 1 * TiB
    max_central_directory_size: int = 128 * MiB
