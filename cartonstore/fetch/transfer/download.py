"""Download one blob from its sources into a BlobWriter, verified.

For each URL in turn: GET with retries; an identity-encoded body that breaks
off resumes with a Range from the bytes already hashed; an encoded one starts
over. The decoded bytes are hashed as they are written; a hash mismatch
discards them and moves on to the next URL. Decoding, hashing and writing
run in the stream's own thread (sink.py), overlapped with receiving.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Collection, Sequence

from cartonstore.errors import CartonStoreError, FetchError, FetchNotFound, IntegrityError, InvalidInput
from cartonstore.fetch.http.client import HttpClient, Response, translate, with_retries
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.fetch.http.content_encoding import ContentDecoder
from cartonstore.fetch.http.policy import describe
from cartonstore.fetch.http.sink import StreamSink, in_own_thread
from cartonstore.fetch.http.socket_body import receive_directly, take_socket
from cartonstore.store.content.blobs import BlobStore, BlobWriter, StagedBlob

from .stats import Tally, TransferStats, retry_hook, stored_kind

__all__ = ["SourcesFailed", "TransferStats", "download", "fetch_blob", "pump"]


async def pump(response: Response, decoder: ContentDecoder, writer: BlobWriter, *, tally: Tally | None = None,
               reserve: int = 0) -> int:
    """Move a response body through decoder into writer; returns body bytes.
    Decoding, hashing and writing run in the stream's own thread (StreamSink)
    while the loop receives. With ``reserve``, the file's space for that many
    bytes is allocated first (in that thread: the body is read from the start)."""

    def work(chunk: bytes) -> None:
        nonlocal reserve
        if reserve:
            writer.reserve(reserve)
            reserve = 0
        for piece in decoder.feed(chunk):
            writer.write(piece)

    received = await stream_into(response, work, tally=tally)
    if response.length is not None and received != response.length:
        raise FetchError(f"{describe(response.url)}: body has {received} bytes, Content-Length said "
                         f"{response.length}", subject=response.url, retryable=True)
    decoder.finish()  # only checks that every stream ended: nothing is left to write
    return received


async def stream_into(response: Response, work: Callable[[bytes], None], *, tally: Tally | None = None,
                      limit: int | None = None) -> int:
    """Hand the body, up to ``limit`` bytes, to ``work`` in the stream's own
    thread; returns the bytes handed over, each counted in ``tally`` as it
    arrives. A big plain-HTTP body is read from its socket by that thread
    (socket_body.py); any other through aiohttp and a StreamSink."""
    length = response.length
    want = length if limit is None or length is None else min(limit, length)
    try:
        # A length-less body is aiohttp's (want may still be the limit: not a length to read to).
        taken = take_socket(response.raw, want, response.headers) if length is not None else None
    except Exception as e:  # aiohttp's error on a body already broken
        raise translate(e, response.url) from e
    if taken is not None:
        return await receive_directly(taken, response.raw, want, work, url=response.url,  # type: ignore[arg-type]  # taken: a length
                                      stall_timeout=response.stall_timeout,
                                      counted=tally.add if tally is not None else None)
    handed = 0
    async with StreamSink(work, name="fetch") as sink:
        async for chunk in response.chunks():
            if tally is not None:
                tally.add(len(chunk))
            if limit is not None and handed + len(chunk) > limit:  # a response running on past what is wanted
                if tally is not None:
                    tally.more(handed + len(chunk) - limit)
                chunk = chunk[: limit - handed]
            await sink.put(chunk)
            handed += len(chunk)
            if limit is not None and handed >= limit:
                break
    return handed


class _RangesRefused(FetchError):
    """A server advertised ranges but answered a part with 200."""


def wants_parts(response: Response, config: FetchConfig, resuming: bool) -> bool:
    """A big identity body from a server that does ranges is fetched in parts."""
    return (not resuming and config.parallel_parts > 1 and not response.encodings and response.status == 200
            and response.accepts_ranges and (response.length or 0) >= config.parallel_threshold)


async def download(client: HttpClient, url: str, writer: BlobWriter, config: FetchConfig, *,
                   stats: TransferStats | None = None, source: str = "url", expected_size: int | None = None,
                   route: str | None = None, from_carton: bool = False) -> None:
    """Fetch url's whole decoded body into writer, retrying and resuming;
    its bytes count in stats as coming from this kind of source, and it
    goes through that kind's proxy, or ``route``'s when given (a registry's
    mirror counts as "mirror" and is reached as a registry is). With
    ``expected_size`` (what a registry's manifest says), a body that is or
    decodes to more is refused as soon as it shows. ``from_carton``: a
    carton named url (HttpClient.get)."""
    limit = config.max_blob_size if expected_size is None else min(expected_size, config.max_blob_size or expected_size)
    route = route or source
    resumable = False
    parts_ok = True

    async def attempt(_n: int) -> None:
        nonlocal resumable, parts_ok
        start = writer.size if resumable and writer.size else 0
        if start == 0 and writer.size:
            await asyncio.to_thread(writer.reset)
        if stats is not None:
            stats.request()
        async with client.get(url, start=start, encoded=start == 0, kind=route, from_carton=from_carton) as response:
            tally = Tally(stats, response.length or 0, source=source)
            try:
                if response.start != start:  # Range ignored: the body starts at 0 again
                    await asyncio.to_thread(writer.reset)
                if expected_size is not None and response.total is not None and response.total != expected_size:
                    raise FetchError(size_lie(url, response.total, expected_size), subject=url)
                if parts_ok and wants_parts(response, config, start > 0):
                    try:
                        await download_parts(client, url, response, writer, config, tally=tally, route=route,
                                             from_carton=from_carton)
                    except _RangesRefused as e:
                        parts_ok = False  # the next attempt streams the body in one piece
                        raise FetchError(e.message, subject=url, retryable=True) from None
                    return
                resumable = not response.encodings and response.accepts_ranges
                decoder = ContentDecoder(response.encodings, url=url, max_output=limit)
                size = response.start + response.length if not response.encodings and response.length else 0
                if limit is not None and size > limit:
                    size = 0  # not reserved: the decoder refuses the body as too large, naming why
                await pump(response, decoder, writer, tally=tally, reserve=size)
            finally:
                tally.settle()

    await with_retries(config, attempt, on_retry=retry_hook(stats, config, url))


def size_lie(url: str, got: int, expected: int) -> str:
    return (f"{describe(url)}: sent {got} bytes, its manifest says {expected}; a blob must be exactly the size "
            f"the manifest says")


class _Part:
    """One Range part of a blob: [start, end), written up to ``written``
    (advanced by the part's sink thread)."""

    def __init__(self, writer: BlobWriter, start: int, end: int) -> None:
        self.writer = writer
        self.written = start
        self.end = end

    def write(self, chunk: bytes) -> None:
        self.writer.write_at(self.written, chunk)
        self.written += len(chunk)


def split_parts(size: int, parts: int) -> list[tuple[int, int]]:
    step = -(-size // parts)
    return [(s, min(size, s + step)) for s in range(0, size, step)]


async def download_parts(client: HttpClient, url: str, first: Response, writer: BlobWriter, config: FetchConfig, *,
                         tally: Tally, route: str, from_carton: bool = False) -> None:
    """Fetch [0, size) as parallel Range parts written in place; the first part
    comes from the response already open. The file is hashed in order as its
    prefix grows (PrefixHasher), overlapped with the parts still arriving.
    Every part counts into ``tally``, which planned the whole size."""
    stats = tally.stats
    size = first.length or 0
    if config.max_blob_size is not None and size > config.max_blob_size:
        raise FetchError(f"{describe(url)}: body is {size} bytes, over the {config.max_blob_size} allowed",
                         subject=url)

    async def fill(response: Response, part: _Part) -> None:
        """Write the response's bytes from part.written on, up to part.end.
        On any failure, part.written is where the written bytes end: each
        byte is written once (the hasher may already have read it)."""
        await stream_into(response, part.write, tally=tally, limit=part.end - part.written)

    async def fetch_part(start: int, end: int, opened: Response | None = None) -> None:
        part = _Part(writer, start, end)
        if opened is not None:
            try:
                await fill(opened, part)
            except FetchError as e:
                if not e.retryable:
                    raise

        async def attempt(_n: int) -> None:
            if part.written >= end:
                return
            if stats is not None:
                stats.request()
            async with client.get(url, start=part.written, end=end, encoded=False, kind=route,
                                  from_carton=from_carton) as response:
                if response.status != 206:
                    raise _RangesRefused(f"{describe(url)}: ignored a Range request for a part", subject=url)
                await fill(response, part)
                if part.written < end:
                    raise FetchError(f"{describe(url)}: part ended at {part.written}, expected {end}", subject=url,
                                     retryable=True)

        await with_retries(config, attempt, on_retry=retry_hook(stats, config, url))

    hasher = await asyncio.to_thread(writer.hash_parts, size)
    hashing = in_own_thread(hasher.run, name="hash")  # follows the parts as they land
    ranges = split_parts(size, config.parallel_parts)
    tasks = [asyncio.ensure_future(fetch_part(*ranges[0], opened=first))]
    tasks += [asyncio.ensure_future(fetch_part(s, e)) for s, e in ranges[1:]]
    try:
        await asyncio.gather(*tasks)
        await asyncio.shield(hashing)  # cancelled or not, the thread is waited for below
    finally:
        for t in tasks:  # one part failing stops the others before the file is reused
            t.cancel()
        hasher.stop()  # a worker thread cannot be cancelled: told, and waited for
        await asyncio.gather(*tasks, hashing, return_exceptions=True)
    writer.parts_hashed()


class SourcesFailed(FetchError):
    """No source delivered a blob; ``problems`` says why, one line per
    source, and ``errors`` holds what each raised."""

    def __init__(self, message: str, *, subject: str | None, problems: Sequence[str],
                 errors: Sequence[CartonStoreError] = ()) -> None:
        last = errors[-1] if errors and isinstance(errors[-1], FetchError) else None
        super().__init__(message, subject=subject,
                         retryable=bool(errors) and all(getattr(e, "retryable", False) for e in errors),
                         status=last.status if last else None, error_code=last.error_code if last else None)
        self.problems = list(problems)
        self.errors = list(errors)

    @property
    def none_had_it(self) -> bool:
        """Every source answered that it has no such blob (HTTP 404 or 410)."""
        return bool(self.errors) and all(isinstance(e, FetchNotFound) for e in self.errors)


async def stage_to_the_end(writer: BlobWriter, *, expected_digest: str | None = None,
                           expected_size: int | None = None) -> StagedBlob:
    """writer.stage in a thread, for every fetch that stages what it wrote.
    A cancelled fetch still waits for that thread (its writer must not be
    closed under it) and discards what it staged: otherwise a fetch
    cancelled as the thread finished left its file in tmp/ (all_or_none
    cancels the others when one blob fails)."""
    task = asyncio.ensure_future(asyncio.to_thread(writer.stage, expected_digest=expected_digest,
                                                   expected_size=expected_size))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is None:
            task.result().discard()
        raise


async def fetch_blob(client: HttpClient, blobs: BlobStore, digest: str, urls: Sequence[str],
                     config: FetchConfig, *, stats: TransferStats | None = None,
                     kind_of: Callable[[str], str] | None = None, expected_size: int | None = None,
                     route: str | None = None, carton_named: Collection[str] = (),
                     watch: Callable[[BlobWriter], None] | None = None) -> StagedBlob:
    """Try each URL until one delivers bytes that hash to digest (and are
    ``expected_size`` long, when given); returns them staged, their origin
    the kind of the URL that delivered them (stored_kind). Raises
    FetchError listing what went wrong with every URL. ``kind_of(url)`` says
    what kind of source a URL is ("url", "mirror", "registry"); ``route``,
    whose proxy they go through when not their kind's (download);
    ``carton_named``, those of urls a carton named rather than a caller or
    the operator (policy.check_link holds for them); ``watch``, called
    with each URL's writer as it opens, for a caller that reads the bytes
    as they land."""
    problems: list[str] = []
    errors: list[CartonStoreError] = []
    for url in urls:
        kind = kind_of(url) if kind_of is not None else "url"
        try:
            with blobs.writer(label="fetch") as writer:
                if watch is not None:
                    watch(writer)
                await download(client, url, writer, config, stats=stats, source=kind, expected_size=expected_size,
                               route=route, from_carton=url in carton_named)
                if expected_size is not None and writer.size != expected_size:
                    raise FetchError(size_lie(url, writer.size, expected_size), subject=url)
                staged = await stage_to_the_end(writer, expected_digest=digest)
                if stats is not None:
                    stats.blobs(kind)
                return dataclasses.replace(staged, origin=stored_kind(kind))
        except IntegrityError as e:
            problems.append(f"{describe(url)}: {e.message}")
            errors.append(e)
        except InvalidInput as e:
            problems.append(e.message)
            errors.append(e)
        except CartonStoreError as e:
            problems.append(e.message if describe(url) in e.message else f"{describe(url)}: {e.message}")
            errors.append(e)
    if not urls:
        raise FetchError(f"blob {digest} is missing and no URL or mirror is known for it", subject=digest)
    raise SourcesFailed(f"could not fetch blob {digest} from any of its {len(urls)} source(s):\n  "
                        + "\n  ".join(problems), subject=digest, problems=problems, errors=errors)
