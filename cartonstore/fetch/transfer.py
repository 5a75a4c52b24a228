"""Download one blob from its sources into a BlobWriter, verified.

For each URL in turn: GET with retries; an identity-encoded body that breaks
off resumes with a Range from the bytes already hashed; an encoded one starts
over. The decoded bytes are hashed as they are written; a hash mismatch
discards them and moves on to the next URL. Decoding, hashing and writing
run in a worker thread, overlapped with receiving the next chunk.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Sequence

from ..errors import CartonStoreError, FetchError, IntegrityError, InvalidInput
from ..store.blobs import BlobStore, BlobWriter, StagedBlob
from .config import FetchConfig
from .encoding import ContentDecoder
from .http import HttpClient, Response, with_retries
from .policy import describe
from .stats import Tally, TransferStats, retry_hook

__all__ = ["SourcesFailed", "TransferStats", "download", "fetch_blob", "pump"]


def _feed(decoder: ContentDecoder, writer: BlobWriter, chunk: bytes) -> None:
    for piece in decoder.feed(chunk):
        writer.write(piece)


def _finish(decoder: ContentDecoder, writer: BlobWriter) -> None:
    rest = decoder.finish()
    for piece in rest or ():
        writer.write(piece)


async def pump(response: Response, decoder: ContentDecoder, writer: BlobWriter, *, tally: Tally | None = None) -> int:
    """Move a response body through decoder into writer; returns body bytes.
    At most one write is in flight while the next chunk is awaited."""
    pending: asyncio.Future | None = None
    received = 0
    try:
        async for chunk in response.chunks():
            received += len(chunk)
            if tally is not None:
                tally.add(len(chunk))
            if pending is not None:
                await pending
            pending = asyncio.ensure_future(asyncio.to_thread(_feed, decoder, writer, chunk))
        if pending is not None:
            await pending
            pending = None
    finally:
        if pending is not None:  # never leave a thread writing into a file we may reset
            await asyncio.gather(pending, return_exceptions=True)
    if response.length is not None and received != response.length:
        raise FetchError(f"{describe(response.url)}: body has {received} bytes, Content-Length said "
                         f"{response.length}", subject=response.url, retryable=True)
    await asyncio.to_thread(_finish, decoder, writer)
    return received


class _RangesRefused(FetchError):
    """A server advertised ranges but answered a part with 200."""


def wants_parts(response: Response, config: FetchConfig, resuming: bool) -> bool:
    """A big identity body from a server that does ranges is fetched in parts."""
    return (not resuming and config.parallel_parts > 1 and not response.encodings and response.status == 200
            and response.accepts_ranges and (response.length or 0) >= config.parallel_threshold)


async def download(client: HttpClient, url: str, writer: BlobWriter, config: FetchConfig, *,
                   stats: TransferStats | None = None, source: str = "url") -> None:
    """Fetch url's whole decoded body into writer, retrying and resuming;
    its bytes count in stats as coming from this kind of source."""
    resumable = False
    parts_ok = True

    async def attempt(_n: int) -> None:
        nonlocal resumable, parts_ok
        start = writer.size if resumable and writer.size else 0
        if start == 0 and writer.size:
            await asyncio.to_thread(writer.reset)
        if stats is not None:
            stats.request()
        async with client.get(url, start=start, encoded=start == 0) as response:
            tally = Tally(stats, response.length or 0, source=source)
            try:
                if response.start != start:  # Range ignored: the body starts at 0 again
                    await asyncio.to_thread(writer.reset)
                if parts_ok and wants_parts(response, config, start > 0):
                    try:
                        await download_parts(client, url, response, writer, config, tally=tally)
                    except _RangesRefused as e:
                        parts_ok = False  # the next attempt streams the body in one piece
                        raise FetchError(e.message, subject=url, retryable=True) from None
                    return
                resumable = not response.encodings and response.accepts_ranges
                decoder = ContentDecoder(response.encodings, url=url, max_output=config.max_blob_size)
                await pump(response, decoder, writer, tally=tally)
            finally:
                tally.settle()

    await with_retries(config, attempt, on_retry=retry_hook(stats, config, url))


def split_parts(size: int, parts: int) -> list[tuple[int, int]]:
    step = -(-size // parts)
    return [(s, min(size, s + step)) for s in range(0, size, step)]


async def download_parts(client: HttpClient, url: str, first: Response, writer: BlobWriter, config: FetchConfig, *,
                         tally: Tally) -> None:
    """Fetch [0, size) as parallel Range parts written in place; the first part
    comes from the response already open. The file is hashed once assembled.
    Every part counts into ``tally``, which planned the whole size."""
    stats = tally.stats
    size = first.length or 0
    if config.max_blob_size is not None and size > config.max_blob_size:
        raise FetchError(f"{describe(url)}: body is {size} bytes, over the {config.max_blob_size} allowed",
                         subject=url)

    async def fill(response: Response, pos: int, end: int) -> int:
        async for chunk in response.chunks():
            take = chunk[: end - pos]
            tally.add(len(chunk))
            if len(take) < len(chunk):  # the first response runs on past its part
                tally.more(len(chunk) - len(take))
            await asyncio.to_thread(writer.write_at, pos, take)
            pos += len(take)
            if pos >= end:
                break
        return pos

    async def part(start: int, end: int, opened: Response | None = None) -> None:
        pos = start
        if opened is not None:
            try:
                pos = await fill(opened, pos, end)
            except FetchError as e:
                if not e.retryable:
                    raise

        async def attempt(_n: int) -> None:
            nonlocal pos
            if pos >= end:
                return
            if stats is not None:
                stats.request()
            async with client.get(url, start=pos, end=end, encoded=False) as response:
                if response.status != 206:
                    raise _RangesRefused(f"{describe(url)}: ignored a Range request for a part", subject=url)
                pos = await fill(response, pos, end)
                if pos < end:
                    raise FetchError(f"{describe(url)}: part ended at {pos}, expected {end}", subject=url,
                                     retryable=True)

        await with_retries(config, attempt, on_retry=retry_hook(stats, config, url))

    ranges = split_parts(size, config.parallel_parts)
    tasks = [asyncio.ensure_future(part(*ranges[0], opened=first))]
    tasks += [asyncio.ensure_future(part(s, e)) for s, e in ranges[1:]]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:  # one part failing stops the others before the file is reused
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.to_thread(writer.hash_written, size)


class SourcesFailed(FetchError):
    """No source delivered a blob; ``problems`` says why, one line per source."""

    def __init__(self, message: str, *, subject: str | None, problems: Sequence[str]) -> None:
        super().__init__(message, subject=subject)
        self.problems = list(problems)


async def fetch_blob(client: HttpClient, blobs: BlobStore, digest: str, urls: Sequence[str],
                     config: FetchConfig, *, stats: TransferStats | None = None,
                     kind_of: Callable[[str], str] | None = None) -> StagedBlob:
    """Try each URL until one delivers bytes that hash to digest; returns
    them staged. Raises FetchError listing what went wrong with every URL.
    ``kind_of(url)`` says what kind of source a URL is ("url", "mirror")."""
    problems: list[str] = []
    for url in urls:
        kind = kind_of(url) if kind_of is not None else "url"
        try:
            with blobs.writer(label="fetch") as writer:
                await download(client, url, writer, config, stats=stats, source=kind)
                staged = await asyncio.to_thread(writer.stage, expected_digest=digest)
                if stats is not None:
                    stats.blobs(kind)
                return staged
        except IntegrityError as e:
            problems.append(f"{describe(url)}: {e.message}")
        except InvalidInput as e:
            problems.append(e.message)
        except CartonStoreError as e:
            problems.append(e.message if describe(url) in e.message else f"{describe(url)}: {e.message}")
    if not urls:
        raise FetchError(f"blob {digest} is missing and no URL or mirror is known for it", subject=digest)
    raise SourcesFailed(f"could not fetch blob {digest} from any of its {len(urls)} source(s):\n  "
                        + "\n  ".join(problems), subject=digest, problems=problems)
