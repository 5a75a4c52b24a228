"""A tar layer of a model artifact, unpacked into staged blobs as it streams.

The registry's body is never held whole nor written to disk as a tar: the
stream's own thread (fetch's stream_into) hashes the compressed bytes (the
layer's digest is checked at the end) and decompresses them (fetch's
ContentDecoder: gzip, zstd, bounded) into a pipe; a second thread reads
the pipe with tarfile in stream mode and writes each regular file into a
staged blob, hashing it as it goes. A member that is a symlink, a hard
link, a device, a fifo, has an absolute path or a ``..`` component, or
whose path another member of the layer already has, is refused by name
before anything of it is written; directories are only implied by the
files' paths. On any failure every blob staged from the layer is
discarded, so the store is as it was.

A small layer may declare much: the limits are the store's zip limits.
The decompressed layer is at most ``max_ratio`` times its size (or
``ratio_floor`` bytes, whichever is more; never past the fetch's
``max_blob_size``), it has at most ``max_entries`` members, and the
extended headers (pax, GNU long names) ahead of one member hold at most
MAX_EXTENDED_HEADERS bytes: tarfile reads such a header whole at the
size it declares, so it is refused before it is read.
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
from cartonstore.fetch.http.content_encoding import ContentDecoder, DecodedTooLarge
from cartonstore.fetch.http.policy import describe
from cartonstore.fetch.transfer.download import size_lie, stream_into
from cartonstore.fetch.transfer.stats import Tally, retry_hook
from cartonstore.format.paths import carton_path_problem
from cartonstore.store.content.blobs import BlobStore, StagedBlob
from cartonstore.zipfmt import ZipLimits

from .model_formats import GZIP, SNIFF, ZSTD, ModelLayer

if TYPE_CHECKING:
    from cartonstore.fetch.http.client import HttpClient
    from cartonstore.fetch.http.config import FetchConfig
    from cartonstore.fetch.transfer.stats import TransferStats

PIPE_WINDOW = 8 << 20
"""Decompressed bytes waiting for the tar reader: the memory one layer holds."""
PIECE = 1 << 20
MAX_EXTENDED_HEADERS = 1 << 20
"""Bytes of pax and GNU long-name headers ahead of one member (and of
global pax headers in one layer); real ones hold a long path, a link's
target, a few times and attributes."""
MAX_EXTENDED_IN_A_ROW = 16
"""Extended headers ahead of one member: tarfile reads each chain by
recursion, so a long one of empty headers is refused too."""
_EXTENDED = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
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


class _Refused(Exception):
    """A header refused before tarfile reads what it declares (its reason)."""


class _BoundedTarInfo(tarfile.TarInfo):
    """A header refused (_header_refusal) before tarfile reads the bytes it declares."""

    def _proc_member(self, tar: _BoundedTarFile) -> tarfile.TarInfo:
        refusal = _header_refusal(self, tar)
        if refusal is not None:
            raise _Refused(refusal)
        return super()._proc_member(tar)  # type: ignore[misc]  # tarfile's hook, untyped

    def _proc_gnusparse_10(self, member: tarfile.TarInfo, pax_headers: dict, tar: _BoundedTarFile) -> None:
        # its map follows the pax header, read for as long as the count it starts with says
        raise _Refused(f"member {member.name!r}: not a regular file (a GNU sparse file)")


class _BoundedTarFile(tarfile.TarFile):
    """A TarFile whose headers are checked before their declared bytes are
    read (_BoundedTarInfo); counts what the extended headers hold."""

    tarinfo = _BoundedTarInfo
    # Counted per archive from these starts (opening reads the first header).
    extended_bytes = 0
    extended_in_a_row = 0
    global_bytes = 0


def _header_refusal(header: tarfile.TarInfo, tar: _BoundedTarFile) -> str | None:
    """Why a header may not be read further, or None; counts what it holds."""
    if header.type == tarfile.GNUTYPE_SPARSE:   # its extension blocks are read as long as they say more follow
        return f"member {header.name!r}: not a regular file (tar type {header.type!r})"
    if header.type == tarfile.XGLTYPE:
        tar.global_bytes += header.size
        if tar.global_bytes > MAX_EXTENDED_HEADERS:
            return f"has global pax headers of more than {MAX_EXTENDED_HEADERS} bytes"
    if header.type in (*_EXTENDED, tarfile.XGLTYPE):
        tar.extended_bytes += header.size
        tar.extended_in_a_row += 1
        if tar.extended_bytes > MAX_EXTENDED_HEADERS:
            return (f"has an extended header (tar type {header.type!r}) of {header.size} bytes; the headers "
                    f"ahead of one member may hold at most {MAX_EXTENDED_HEADERS}")
        if tar.extended_in_a_row > MAX_EXTENDED_IN_A_ROW:
            return f"has more than {MAX_EXTENDED_IN_A_ROW} extended headers ahead of one member"
        return None
    tar.extended_bytes = tar.extended_in_a_row = 0
    return None


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


def _unpack(pipe: _Pipe, blobs: BlobStore, layer: ModelLayer, limits: ZipLimits) -> list[tuple[str, StagedBlob]]:
    """Read the tar from the pipe; every regular member staged, by its path."""
    files: list[tuple[str, StagedBlob]] = []
    paths: set[str] = set()
    try:
        with _BoundedTarFile.open(fileobj=pipe, mode="r|", bufsize=PIECE) as tar:  # type: ignore[call-overload]  # a readable, not a file
            for count, member in enumerate(tar, 1):
                refusal = _member_refusal(member, count, paths, layer, limits)
                if refusal is not None:
                    raise InvalidInput(refusal, subject=f"sha256:{layer.digest}")
                if member.isdir():
                    continue
                source = tar.extractfile(member)
                assert source is not None   # a regular file
                with blobs.writer(label="unpack") as writer:
                    while piece := source.read(PIECE):
                        writer.write(piece)
                    files.append((member_path(member), writer.stage()))
                paths.add(member_path(member))
        return files
    except BaseException as e:
        pipe.stop_reading(failed=True)
        for _path, staged in files:
            staged.discard()
        if isinstance(e, _Refused):
            raise InvalidInput(f"{layer} {e}", subject=f"sha256:{layer.digest}") from None
        if isinstance(e, tarfile.TarError):
            raise InvalidInput(f"{layer} is not a readable tar archive ({e})",
                               subject=f"sha256:{layer.digest}") from None
        raise
    finally:
        pipe.stop_reading()


def _member_refusal(member: tarfile.TarInfo, count: int, paths: set[str], layer: ModelLayer,
                    limits: ZipLimits) -> str | None:
    """Why the layer's ``count``-th member may not be written, or None:
    what it is, more members than the store takes, or a file's path that a
    member before it has (``paths``)."""
    problem = member_problem(member)
    if problem is not None:
        return f"{layer} member {member.name!r}: {problem}"
    if count > limits.max_entries:
        return f"{layer} has more than {limits.max_entries} members ([limits] zip_max_entries)"
    if not member.isdir() and member_path(member) in paths:
        return f"member {member_path(member)!r} appears twice in {layer}"
    return None


def _codings(layer: ModelLayer, head: bytes) -> tuple[str, ...]:
    compression = layer.compression
    if compression == SNIFF:
        compression = GZIP if head.startswith(_GZIP_MAGIC) else ZSTD if head.startswith(_ZSTD_MAGIC) else ""
    return (compression,) if compression else ()


def output_limit(layer_size: int, limits: ZipLimits, max_blob_size: int | None) -> tuple[int, str]:
    """The most bytes a layer of ``layer_size`` may decompress to, and why."""
    by_ratio = max(limits.ratio_floor, layer_size * limits.max_ratio)
    if max_blob_size is not None and max_blob_size < by_ratio:
        return max_blob_size, "[fetch] max_blob_size"
    return by_ratio, (f"[limits] zip_max_ratio: {limits.max_ratio} times its {layer_size} bytes, "
                      f"or {limits.ratio_floor} for a smaller layer")


async def unpack_layer(client: HttpClient, url: str, layer: ModelLayer, blobs: BlobStore, config: FetchConfig,
                       limits: ZipLimits, *, stats: TransferStats | None = None) -> list[tuple[str, StagedBlob]]:
    """The regular files of a tar layer at ``url``, each staged (path, blob),
    in the archive's order; the layer's bytes verified against its digest
    and size, the tar within ``limits``. Retried from the start when the
    stream breaks off."""

    async def attempt(_n: int) -> list[tuple[str, StagedBlob]]:
        pipe = _Pipe()
        reading = asyncio.ensure_future(asyncio.to_thread(_unpack, pipe, blobs, layer, limits))
        try:
            await _stream(client, url, layer, pipe, config, limits, stats)
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
                  limits: ZipLimits, stats: TransferStats | None) -> None:
    """The layer's body through hash and decompressor into the pipe."""
    digest = hashlib.sha256()
    decoder: ContentDecoder | None = None
    received = 0
    most, why = output_limit(layer.size, limits, config.max_blob_size)

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
            # The layer's declared size bounds the whole up front, so the
            # decoder's running ratio (of the bytes so far) is not checked
            # before that bound: a run of zeros early in a layer is no bomb.
            decoder = ContentDecoder(_codings(layer, chunk), url=url, max_output=most,
                                     max_ratio=limits.max_ratio, ratio_floor=most)
        try:
            for piece in decoder.feed(chunk):
                pipe.write(piece)
        except DecodedTooLarge:
            raise InvalidInput(f"{layer} decompresses to more than {most} bytes ({why}): refused as a "
                               f"decompression bomb", subject=f"sha256:{layer.digest}") from None

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

