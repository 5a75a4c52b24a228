"""A tar layer of a model artifact, unpacked into staged blobs as it streams.

The registry's body is never held whole nor written to disk as a tar: the
stream's own thread (fetch's stream_into) hashes the compressed bytes (the
layer's digest is checked at the end) and decompresses them (fetch's
ContentDecoder: gzip, zstd, bounded) into a pipe; a second thread reads
the pipe with tarfile in stream mode and writes each regular file into a
staged blob, hashing it as it goes. A member that is a symlink, a hard
link, a device, a fifo, has an absolute path or a ``..`` component is
refused by name before anything of it is written; directories are only
implied by the files' paths. On any failure every blob staged from the
layer is discarded, so the store is as it was.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import tarfile
import threading
from typing import TYPE_CHECKING

from cartonstore.errors import FetchError, IntegrityError, InvalidInput
from cartonstore.fetch.http.client import with_retries
from cartonstore.fetch.http.content_encoding import ContentDecoder
from cartonstore.fetch.http.policy import describe
from cartonstore.fetch.transfer.download import size_lie, stream_into
from cartonstore.fetch.transfer.stats import Tally, retry_hook
from cartonstore.format.paths import carton_path_problem
from cartonstore.store.content.blobs import BlobStore, StagedBlob

from .model_formats import GZIP, SNIFF, ZSTD, ModelLayer

if TYPE_CHECKING:
    from cartonstore.fetch.http.client import HttpClient
    from cartonstore.fetch.http.config import FetchConfig
    from cartonstore.fetch.transfer.stats import TransferStats

PIPE_WINDOW = 8 << 20
"""Decompressed bytes waiting for the tar reader: the memory one layer holds."""
PIECE = 1 << 20
_GZIP_MAGIC, _ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a tar member may not be written into a model folder, or None."""
    name = member.name
    if name.startswith("/"):
        return "an absolute path"
    if ".." in name.split("/"):
        return "a path that leaves the model folder"
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a fifo"
    if member.isdir():
        return None
    if not member.isreg() or member.issparse():
        return f"not a regular file (tar type {member.type!r})"
    problem = carton_path_problem(member_path(member))
    return None if problem is None else f"a path that {problem}"


def member_path(member: tarfile.TarInfo) -> str:
    """A member's path in the model folder: its name less any ``./``."""
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/") if member.isdir() else name


class _Pipe:
    """Bytes from the stream's thread to the tar reader's, at most
    PIPE_WINDOW waiting. A reader that stopped (done or failed) lets the
    writer drop what follows; a writer that stopped ends the reader's input."""

    def __init__(self) -> None:
        self._pieces: collections.deque[bytes] = collections.deque()
        self._waiting = 0
        self._ended = False
        self.reader_stopped = False
        self.reader_failed = False
        self._cond = threading.Condition()

    def write(self, data: bytes) -> None:
        with self._cond:
            while self._waiting >= PIPE_WINDOW and not self.reader_stopped:
                self._cond.wait()
            if not self.reader_stopped:
                self._pieces.append(data)
                self._waiting += len(data)
                self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def stop_reading(self, *, failed: bool = False) -> None:
        with self._cond:
            self.reader_stopped = True
            self.reader_failed = self.reader_failed or failed
            self._pieces.clear()
            self._cond.notify_all()

    def read(self, size: int = -1) -> bytes:
        with self._cond:
            while not self._pieces and not self._ended:
                self._cond.wait()
            if not self._pieces:
                return b""
            piece = self._pieces.popleft()
            if 0 <= size < len(piece):
                self._pieces.appendleft(piece[size:])
                piece = piece[:size]
            self._waiting -= len(piece)
            self._cond.notify_all()
            return piece


class _ReaderStopped(Exception):
    """The tar reader failed: the stream stops (its error is the one raised)."""


def _unpack(pipe: _Pipe, blobs: BlobStore, layer: ModelLayer) -> list[tuple[str, StagedBlob]]:
    """Read the tar from the pipe; every regular member staged, by its path."""
    files: list[tuple[str, StagedBlob]] = []
    try:
        with tarfile.open(fileobj=pipe, mode="r|", bufsize=PIECE) as tar:  # type: ignore[call-overload]  # a readable, not a file
            for member in tar:
                problem = member_problem(member)
                if problem is not None:
                    raise InvalidInput(f"{layer} member {member.name!r}: {problem}",
                                       subject=f"sha256:{layer.digest}")
                if member.isdir():
                    continue
                source = tar.extractfile(member)
                assert source is not None   # a regular file
                with blobs.writer(label="unpack") as writer:
                    while piece := source.read(PIECE):
                        writer.write(piece)
                    files.append((member_path(member), writer.stage()))
        return files
    except BaseException as e:
        pipe.stop_reading(failed=True)
        for _path, staged in files:
            staged.discard()
        if isinstance(e, tarfile.TarError):
            raise InvalidInput(f"{layer} is not a readable tar archive ({e})",
                               subject=f"sha256:{layer.digest}") from None
        raise
    finally:
        pipe.stop_reading()


def _codings(layer: ModelLayer, head: bytes) -> tuple[str, ...]:
    compression = layer.compression
    if compression == SNIFF:
        compression = GZIP if head.startswith(_GZIP_MAGIC) else ZSTD if head.startswith(_ZSTD_MAGIC) else ""
    return (compression,) if compression else ()


async def unpack_layer(client: HttpClient, url: str, layer: ModelLayer, blobs: BlobStore, config: FetchConfig, *,
                       stats: TransferStats | None = None) -> list[tuple[str, StagedBlob]]:
    """The regular files of a tar layer at ``url``, each staged (path, blob),
    in the archive's order; the layer's bytes verified against its digest
    and size. Retried from the start when the stream breaks off."""

    async def attempt(_n: int) -> list[tuple[str, StagedBlob]]:
        pipe = _Pipe()
        reading = asyncio.ensure_future(asyncio.to_thread(_unpack, pipe, blobs, layer))
        try:
            await _stream(client, url, layer, pipe, config, stats)
            pipe.end()
            return await asyncio.shield(reading)
        except BaseException as e:
            pipe.end()
            pipe.stop_reading()
            await asyncio.wait([reading])   # the thread ends: its input did
            failure = None if reading.cancelled() else reading.exception()
            if failure is None and not reading.cancelled():
                for _path, staged in reading.result():
                    staged.discard()
            if isinstance(e, _ReaderStopped) and failure is not None:
                raise failure from None   # why the reader stopped: a member refused, not a tar
            raise

    return await with_retries(config, attempt, on_retry=retry_hook(stats, config, url))


async def _stream(client: HttpClient, url: str, layer: ModelLayer, pipe: _Pipe, config: FetchConfig,
                  stats: TransferStats | None) -> None:
    """The layer's body through hash and decompressor into the pipe."""
    digest = hashlib.sha256()
    decoder: ContentDecoder | None = None
    received = 0

    def work(chunk: bytes) -> None:
        nonlocal decoder, received
        if pipe.reader_failed:
            raise _ReaderStopped()
        received += len(chunk)
        if received > layer.size:
            raise IntegrityError(f"{layer}: {describe(url)} sent more than the {layer.size} bytes its manifest says",
                                 subject=f"sha256:{layer.digest}")
        digest.update(chunk)
        if decoder is None:
            decoder = ContentDecoder(_codings(layer, chunk), url=url, max_output=config.max_blob_size)
        for piece in decoder.feed(chunk):
            pipe.write(piece)

    if stats is not None:
        stats.request()
    async with client.get(url, encoded=False, kind="registry") as response:
        if response.length is not None and response.length != layer.size:
            raise FetchError(size_lie(url, response.length, layer.size), subject=url)
        tally = Tally(stats, response.length or 0, source="registry")
        try:
            await stream_into(response, work, tally=tally)
        finally:
            tally.settle()
    if received != layer.size:
        raise FetchError(f"{describe(url)}: {layer} ended after {received} of its {layer.size} bytes", subject=url,
                         retryable=True)
    if decoder is not None:
        decoder.finish()
    if digest.hexdigest() != layer.digest:
        raise IntegrityError(f"{layer}: its bytes hash to sha256:{digest.hexdigest()}",
                             subject=f"sha256:{layer.digest}")

