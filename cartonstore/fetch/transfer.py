"""Download one blob from its sources into a BlobWriter, verified.

For each URL in turn: GET with retries; an identity-encoded body that breaks
off resumes with a Range from the bytes already hashed; an encoded one starts
over. The decoded bytes are hashed as they are written; a hash mismatch
discards them and moves on to the next URL. Decoding, hashing and writing
run in a worker thread, overlapped with receiving the next chunk.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import CartonStoreError, FetchError, IntegrityError, InvalidInput
from ..store.blobs import BlobStore, BlobWriter, StagedBlob
from .config import FetchConfig
from .encoding import ContentDecoder
from .http import HttpClient, Response, with_retries
from .policy import describe

ProgressFn = Callable[[int], None]


@dataclass
class TransferStats:
    bytes_received: int = 0      # on the wire (encoded)
    requests: int = 0
    errors: list[str] = field(default_factory=list)


def _feed(decoder: ContentDecoder, writer: BlobWriter, chunk: bytes) -> None:
    for piece in decoder.feed(chunk):
        writer.write(piece)


def _finish(decoder: ContentDecoder, writer: BlobWriter) -> None:
    rest = decoder.finish()
    for piece in rest or ():
        writer.write(piece)


async def pump(response: Response, decoder: ContentDecoder, writer: BlobWriter, *,
               progress: ProgressFn | None = None, stats: TransferStats | None = None) -> int:
    """Move a response body through decoder into writer; returns body bytes.
    At most one write is in flight while the next chunk is awaited."""
    pending: asyncio.Future | None = None
    received = 0
    try:
        async for chunk in response.chunks():
            received += len(chunk)
            if stats is not None:
                stats.bytes_received += len(chunk)
            if pending is not None:
                await pending
            pending = asyncio.ensure_future(asyncio.to_thread(_feed, decoder, writer, chunk))
            if progress:
                progress(len(chunk))
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


async def download(client: HttpClient, url: str, writer: BlobWriter, config: FetchConfig, *,
                   progress: ProgressFn | None = None, stats: TransferStats | None = None) -> None:
    """Fetch url's whole decoded body into writer, retrying and resuming."""
    resumable = False

    async def attempt(_n: int) -> None:
        nonlocal resumable
        start = writer.size if resumable and writer.size else 0
        if start == 0 and writer.size:
            await asyncio.to_thread(writer.reset)
        if stats is not None:
            stats.requests += 1
        async with client.get(url, start=start, encoded=start == 0) as response:
            if response.start != start:  # Range ignored: the body starts at 0 again
                await asyncio.to_thread(writer.reset)
            resumable = not response.encodings and response.accepts_ranges
            decoder = ContentDecoder(response.encodings, url=url, max_output=config.max_blob_size)
            await pump(response, decoder, writer, progress=progress, stats=stats)

    await with_retries(config, attempt)


async def fetch_blob(client: HttpClient, blobs: BlobStore, digest: str, urls: Sequence[str],
                     config: FetchConfig, *, progress: ProgressFn | None = None,
                     stats: TransferStats | None = None) -> StagedBlob:
    """Try each URL until one delivers bytes that hash to digest; returns
    them staged. Raises FetchError listing what went wrong with every URL."""
    problems: list[str] = []
    for url in urls:
        try:
            with blobs.writer(label="fetch") as writer:
                await download(client, url, writer, config, progress=progress, stats=stats)
                return await asyncio.to_thread(writer.stage, expected_digest=digest)
        except IntegrityError as e:
            problems.append(f"{describe(url)}: {e.message}")
        except InvalidInput as e:
            problems.append(e.message)
        except CartonStoreError as e:
            problems.append(e.message if describe(url) in e.message else f"{describe(url)}: {e.message}")
    if stats is not None:
        stats.errors.extend(problems)
    if not urls:
        raise FetchError(f"blob {digest} is missing and no URL or mirror is known for it", subject=digest)
    raise FetchError(f"could not fetch blob {digest} from any of its {len(urls)} source(s):\n  "
                     + "\n  ".join(problems), subject=digest)
