"""Read a .carton over HTTP lazily: its end, then only the entries needed.

The central directory comes from a suffix Range request; entries are read
with Range requests, neighbours merged into one request when the gap between
them is small. Each entry is decoded (Stored, Deflate, zstd) and checked
(declared size, CRC-32) as its bytes stream past.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from cartonstore.errors import FetchError, InvalidCarton
from cartonstore.fetch.http.client import HttpClient, Response, with_retries
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.policy import describe
from cartonstore.fetch.transfer.download import stream_into
from cartonstore.fetch.transfer.stats import Tally, TransferStats, retry_hook
from cartonstore.sources.view import METADATA_LIMITS, STRING_TENSOR_LIMIT, SYMLINK_TARGET_LIMIT, SourceFile
from cartonstore.sources.zip_source import METADATA_NAMES, check_metadata_size, index_zip_entries, source_file
from cartonstore.zipfmt import (
    LOCAL_HEADER_FIXED,
    TAIL_READ_SIZE,
    EntryDecoder,
    ZipEntry,
    ZipLimits,
    check_directory_limits,
    check_entry_limits,
    local_header_length,
    local_header_lengths,
    locate_central_directory,
    parse_central_directory,
)


class EntrySink(Protocol):
    def write(self, data: bytes) -> None: ...


@dataclass
class RemoteZip:
    url: str
    size: int
    cd_offset: int
    entries: dict[str, ZipEntry]      # carton path -> entry
    spans: dict[ZipEntry, tuple[int, int]]  # entry -> [local header offset, next entry's offset)


async def _read_body(response: Response, limit: int, tally: Tally) -> bytes:
    parts, size = [], 0
    async for chunk in response.chunks():
        size += len(chunk)
        tally.add(len(chunk))
        if size > limit:
            raise FetchError(f"{describe(response.url)}: more bytes than the {limit} asked for", subject=response.url)
        parts.append(chunk)
    return b"".join(parts)


async def fetch_range(client: HttpClient, url: str, start: int, end: int, config: FetchConfig,
                      stats: TransferStats | None = None) -> bytes:
    async def attempt(_n: int) -> bytes:
        if stats is not None:
            stats.request()
        async with client.get(url, start=start, end=end, encoded=False) as r:
            if r.status != 206:
                raise FetchError(f"{describe(url)}: ignored a Range request after honouring one", subject=url)
            tally = Tally(stats, end - start)
            try:
                return await _read_body(r, end - start, tally)
            finally:
                tally.settle()
    return await with_retries(config, attempt, on_retry=retry_hook(stats, config, url))


async def open_remote_zip(client: HttpClient, url: str, config: FetchConfig, limits: ZipLimits,
                          stats: TransferStats | None = None) -> RemoteZip | None:
    """The zip's directory, or None when the server does not do Range requests."""
    async def tail_attempt(_n: int) -> tuple[bytes, int, int] | None:
        if stats is not None:
            stats.request()
        async with client.get(url, suffix=TAIL_READ_SIZE, encoded=False) as r:
            if r.status != 206 or r.total is None:
                return None
            tally = Tally(stats, r.length or 0)
            try:
                data = await _read_body(r, TAIL_READ_SIZE, tally)
            finally:
                tally.settle()
            return data, r.start, r.total

    got = await with_retries(config, tail_attempt, on_retry=retry_hook(stats, config, url))
    if got is None:
        return None
    tail, tail_offset, total = got
    loc = locate_central_directory(tail, tail_offset)
    check_directory_limits(loc, limits)
    if loc.offset >= tail_offset:
        cd = tail[loc.offset - tail_offset: loc.offset - tail_offset + loc.size]
    else:
        head = await fetch_range(client, url, loc.offset, min(loc.offset + loc.size, tail_offset), config, stats)
        cd = head + tail[: max(0, loc.offset + loc.size - tail_offset)]
    entries = parse_central_directory(cd, loc, limits)
    for e in entries:
        check_entry_limits(e, limits)
    ordered = sorted(entries, key=lambda e: e.local_header_offset)
    ends = [e.local_header_offset for e in ordered[1:]] + [loc.offset]
    spans = {e: (e.local_header_offset, end) for e, end in zip(ordered, ends, strict=True)}
    for e, (start, end) in spans.items():
        if end - start < LOCAL_HEADER_FIXED + e.compressed_size:
            raise InvalidCarton(e.name, "entry overlaps the next one or the central directory")
    return RemoteZip(url, total, loc.offset, index_zip_entries(entries), spans)


def plan_requests(spans: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Merge [start, end) spans whose gap is under ``gap`` bytes (pure)."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start - merged[-1][1] < gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


class _SpanParser:
    """Splits a byte stream covering [start, end) of the zip into the
    entries it holds: local header, then compressed data fed to a decoder.
    Only headers are buffered; entry data passes through as slices. An
    entry whose local header does not read, or whose data does not decode
    or check (CRC-32, sizes), is noted in ``broken`` and skipped: its blob
    may have other sources, and the entries after it in the span are still
    read."""

    def __init__(self, start: int, wanted: list[tuple[ZipEntry, EntrySink, int]]) -> None:
        """``wanted``: (entry, its sink, where its span ends: the next entry's offset)."""
        self.pos = start
        self.todo = sorted(wanted, key=lambda w: w[0].local_header_offset)
        self.header = bytearray()
        self.current: tuple[ZipEntry, EntrySink, EntryDecoder | None] | None = None   # None: broken, skipped
        self.left = 0
        self.broken: dict[str, str] = {}   # entry name -> what was wrong with its data

    def feed(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = self._data(view) if self.current is not None else self._between(view)

    def _between(self, view: memoryview) -> memoryview:
        """Skip the gap before the next wanted entry, then read its local header."""
        if not self.todo:
            self.pos += len(view)
            return view[len(view):]
        entry, sink, span_end = self.todo[0]
        skip = entry.local_header_offset - self.pos
        if skip > 0:
            n = min(skip, len(view))
            self.pos += n
            return view[n:]
        try:
            size = LOCAL_HEADER_FIXED if len(self.header) < LOCAL_HEADER_FIXED else self._header_size(entry, span_end)
        except InvalidCarton as e:
            return self._header_broken(entry, e, view)
        take = view[: size - len(self.header)]
        self.header += take
        self.pos += len(take)
        rest = view[len(take):]
        if len(self.header) < LOCAL_HEADER_FIXED:
            return rest
        try:
            if len(self.header) < self._header_size(entry, span_end):
                return rest
            local_header_length(bytes(self.header), entry)   # its name and method, as a local add checks
        except InvalidCarton as e:
            return self._header_broken(entry, e, rest)
        self.header.clear()
        self.todo.pop(0)
        self.current = (entry, sink, EntryDecoder(entry))
        self.left = entry.compressed_size
        if self.left == 0:
            self._end_entry()
        return rest

    def _header_size(self, entry: ZipEntry, span_end: int) -> int:
        """The local header's length, from its fixed part, if it can be the
        entry's: a name as long as the central directory's, and room for its
        data before the next entry (a damaged length would otherwise take the
        next entry's bytes for this one's)."""
        name_length, extra_length = local_header_lengths(bytes(self.header[:LOCAL_HEADER_FIXED]), entry.name,
                                                         entry.local_header_offset)
        if name_length != len(entry.raw_name):
            raise InvalidCarton(entry.name, f"local header gives a {name_length}-byte name, the central "
                                            f"directory a {len(entry.raw_name)}-byte one")
        size = LOCAL_HEADER_FIXED + name_length + extra_length
        if entry.local_header_offset + size + entry.compressed_size > span_end:
            raise InvalidCarton(entry.name, f"local header's extra field ({extra_length} bytes) runs its data past "
                                            f"the next entry at offset {span_end}")
        return size

    def _header_broken(self, entry: ZipEntry, error: InvalidCarton, rest: memoryview) -> memoryview:
        """A local header that does not read (bad signature, another name or
        method than the central directory's) hides where the entry's data
        starts: the entry is broken, like one whose data does not check, and
        the bytes up to the next wanted entry are skipped."""
        self.broken[entry.name] = _problem(entry, error)
        self.header.clear()
        self.todo.pop(0)
        return rest

    def _data(self, view: memoryview) -> memoryview:
        entry, sink, decoder = self.current  # type: ignore[misc]  # called within an entry: current is set
        n = min(self.left, len(view))
        if decoder is not None:
            pieces = decoder.feed(bytes(view[:n]))
            while True:   # piece by piece (1 MiB of compressed zeros can decode to a GiB)
                try:      # the sink's own errors (a full disk, a size limit) are not the entry's: outside the try
                    piece = next(pieces)
                except StopIteration:
                    break
                except InvalidCarton as e:   # the rest of its bytes are skipped, not decoded
                    self.broken[entry.name] = _problem(entry, e)
                    self.current = (entry, sink, None)
                    break
                sink.write(piece)
        self.pos += n
        self.left -= n
        if self.left == 0:
            self._end_entry()
        return view[n:]

    def _end_entry(self) -> None:
        entry, _sink, decoder = self.current  # type: ignore[misc]  # called within an entry: current is set
        self.current = None
        if decoder is not None:
            try:
                decoder.finish()
            except InvalidCarton as e:
                self.broken[entry.name] = _problem(entry, e)

    def finish(self) -> None:
        if self.current is not None or self.todo:
            missing = self.current[0].name if self.current else self.todo[0][0].name
            raise FetchError(f"the response ended inside entry {missing!r}", retryable=True)


def _problem(entry: ZipEntry, error: InvalidCarton) -> str:
    return error.message.removeprefix(f"{entry.name}: ")


async def read_entries(client: HttpClient, rz: RemoteZip, wanted: Sequence[tuple[ZipEntry, Callable[[], EntrySink]]],
                       config: FetchConfig, stats: TransferStats | None = None) -> dict[str, str]:
    """Stream the wanted entries into fresh sinks (one request per merged
    span; a retry makes new sinks for that span's entries). Every span
    counts in stats' expected bytes from the start. Returns the entries
    whose data did not decode or check, with why (their sinks hold garbage)."""
    broken: dict[str, str] = {}
    by_span = {rz.spans[e]: (e, make) for e, make in wanted}
    requests = plan_requests(list(by_span), config.coalesce_gap)
    unstarted = sum(end - start for start, end in requests)
    if stats is not None:
        stats.expect(unstarted)
    try:
        for start, end in requests:
            group = [(e, make, t) for (s, t), (e, make) in by_span.items() if start <= s and t <= end]
            unstarted -= end - start

            async def attempt(n: int, start: int = start, end: int = end, group: list[Any] = group) -> None:
                parser = _SpanParser(start, [(e, make(), span_end) for e, make, span_end in group])
                tally = Tally(stats, end - start, counted=n == 0)
                try:
                    if stats is not None:
                        stats.request()
                    async with client.get(rz.url, start=start, end=end, encoded=False) as r:
                        if r.status != 206:
                            raise FetchError(f"{describe(rz.url)}: ignored a Range request after honouring one",
                                             subject=rz.url)
                        await stream_into(r, parser.feed, tally=tally)   # parsed in the stream's own thread
                        parser.finish()
                    broken.update(parser.broken)   # the attempt that read the span to its end
                finally:
                    tally.settle()

            await with_retries(config, attempt, on_retry=retry_hook(stats, config, rz.url))
    finally:
        if stats is not None and unstarted:
            stats.expect(-unstarted)  # spans never asked for: a failure stopped the rest
    return broken


class BytesSink:
    def __init__(self, limit: int, name: str) -> None:
        self.buf = io.BytesIO()
        self.limit = limit
        self.name = name

    def write(self, data: bytes) -> None:
        if self.buf.tell() + len(data) > self.limit:
            raise InvalidCarton(self.name, f"is more than the {self.limit} bytes allowed for this file")
        self.buf.write(data)


def read_whole_limit(name: str, is_symlink: bool = False) -> int | None:
    """The size limit of a file check_carton reads whole (metadata,
    carton.toml, tensor index, string tensors: .toml in tensor_data/,
    symlink targets), or None for one it never reads."""
    if name in METADATA_LIMITS:
        return METADATA_LIMITS[name]
    if name.startswith("tensor_data/") and name.endswith(".toml"):
        return STRING_TENSOR_LIMIT
    return SYMLINK_TARGET_LIMIT if is_symlink else None


def small_files_to_prefetch(entries: dict[str, ZipEntry]) -> dict[str, int]:
    """The entries check_carton reads whole -> their size limit."""
    return {name: limit for name, e in entries.items()
            if (limit := read_whole_limit(name, e.is_symlink)) is not None}


class RemoteCartonView:
    """A CartonView of a remote zip whose small files were prefetched;
    opening any other file is a programming error."""

    def __init__(self, rz: RemoteZip, small: dict[str, bytes]) -> None:
        self.label = describe(rz.url)
        self.rz = rz
        self._small = small
        self.mended: set[str] = set()   # digests of small files whose bytes came from other sources
        self.broken: dict[str, str] = {}   # small files that arrived corrupt (not in small) -> why
        self.files: dict[str, SourceFile] = {}
        for name, e in rz.entries.items():
            if name not in METADATA_NAMES:
                self.files[name] = source_file(name, e, lambda e, _limit, n=name: small[n])  # type: ignore[misc]  # n: this entry's name

    def read_metadata(self, name: str) -> bytes | None:
        e = self.rz.entries.get(name)
        if e is None:
            return None
        check_metadata_size(name, e)
        return self._small[name]

    def open(self, path: str) -> BinaryIO:
        return io.BytesIO(self._small[path])

    def prefetched(self, path: str) -> bytes | None:
        return self._small.get(path)

    def replace(self, path: str, data: bytes, digest: str) -> None:
        """A prefetched file's right bytes (fetch/metadata_refetch.py), from another source
        (a regular file: symlinks are not mended)."""
        self._small[path] = data
        self.files[path] = SourceFile(path, "file", len(data))
        self.broken.pop(path, None)
        self.mended.add(digest)

    def close(self) -> None:
        pass


async def prefetch_view(client: HttpClient, rz: RemoteZip, config: FetchConfig,
                        stats: TransferStats | None = None) -> RemoteCartonView:
    limits = small_files_to_prefetch(rz.entries)
    for name, limit in limits.items():
        if rz.entries[name].uncompressed_size > limit:
            raise InvalidCarton(name, f"is {rz.entries[name].uncompressed_size} bytes, more than the "
                                      f"{limit} allowed for this file")
    sinks: dict[str, BytesSink] = {}

    def maker(name: str, limit: int) -> Callable[[], EntrySink]:
        def make() -> EntrySink:
            sinks[name] = BytesSink(limit, name)
            return sinks[name]
        return make

    broken = await read_entries(client, rz, [(rz.entries[n], maker(n, lim)) for n, lim in limits.items()],
                                config, stats)
    for name, problem in broken.items():
        if name in METADATA_NAMES or rz.entries[name].is_symlink:   # nothing to fetch them from instead
            raise InvalidCarton(name, problem)
    view = RemoteCartonView(rz, {n: s.buf.getvalue() for n, s in sinks.items() if n not in broken})
    view.broken = broken   # files that arrived corrupt: fetch/metadata_refetch.py fetches them elsewhere, or fails
    return view
