"""Every source is retried (issue 11 §2): a remote-zip entry whose bytes fail
their MANIFEST hash, or arrive corrupt (CRC-32, undecodable), comes from the
blob's other sources (its LINKS URLs, the mirrors) before the add fails, and
a failure names every source and why."""

from __future__ import annotations

import struct
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from conftest import MINIMAL_TOML, carton_entries, manifest_for, sha, snapshot, write_zip
from kit.fetchkit import blob_files, fast_config, pull, tmp_files
from kit.origin import Fault

from cartonstore.errors import InvalidCarton, ManifestMismatch
from cartonstore.fetch.http.config import FetchConfig
from cartonstore.format.links import build_links
from cartonstore.store import Store

GOOD = {"carton.toml": MINIMAL_TOML, "model/w.bin": b"good bytes " * 1000}
W = sha(GOOD["model/w.bin"])


def refused_unchanged(store: Store, url: str, config: FetchConfig | None = None, *,
                      error: type[Exception] = ManifestMismatch) -> str:
    """The add of ``url`` fails with ``error``, the store left as it was; its message."""
    before = snapshot(store.root)
    with pytest.raises(error) as info:
        pull(store, url, config)
    assert snapshot(store.root) == before and tmp_files(store) == []
    return str(info.value)


def zip_with(tmp_path: Path, name: str, wrong: dict[str, bytes], links: dict[str, list[str]] | None = None) -> Path:
    """A carton whose files in ``wrong`` hold other bytes than MANIFEST lists."""
    return write_zip(tmp_path / name, carton_entries(
        {**GOOD, **wrong}, manifest=manifest_for(GOOD), links=build_links(links) if links else None))


def bad_zip(tmp_path: Path, links: dict[str, list[str]] | None = None) -> Path:
    """A carton whose model/w.bin entry holds other bytes than MANIFEST lists."""
    return zip_with(tmp_path, "bad.carton", {"model/w.bin": b"evil bytes " * 1000}, links)


@pytest.mark.parametrize("path,wrong", [("model/w.bin", b"evil bytes " * 1000),   # an entry read when staged
                                        ("carton.toml", MINIMAL_TOML + b"\n# not what MANIFEST lists\n")])  # read first
def test_a_file_with_wrong_bytes_comes_from_its_links_url(store: Store, tmp_path: Path, origin,
                                                          path: str, wrong: bytes) -> None:
    digest = sha(GOOD[path])
    origin.put(f"/blobs/{digest}", GOOD[path])
    origin.put_file("/bad.carton", zip_with(tmp_path, "bad.carton", {path: wrong},
                                            {digest: [origin.url(f"/blobs/{digest}")]}))
    r = pull(store, origin.url("/bad.carton"))
    assert r.complete and r.digest == sha(manifest_for(GOOD))
    assert store.blobs.path(digest).read_bytes() == GOOD[path]
    assert origin.count(f"/blobs/{digest}") == 1
    assert store.verify().ok and tmp_files(store) == []


def test_an_entry_with_wrong_bytes_comes_from_a_mirror(store: Store, tmp_path: Path, origin) -> None:
    origin.put(f"/mirror/{W}", GOOD["model/w.bin"])
    origin.put_file("/bad.carton", bad_zip(tmp_path))
    r = pull(store, origin.url("/bad.carton"), fast_config(mirrors=(origin.url("/mirror"),)))
    assert r.complete and store.blobs.path(W).read_bytes() == GOOD["model/w.bin"]
    assert r.sources["mirror"] == {"bytes": len(GOOD["model/w.bin"]), "blobs": 1}
    assert r.blobs_fetched == len(list(store.blobs.iter_digests())), "each blob counted once"
    assert store.verify().ok and tmp_files(store) == []


def test_every_source_failing_is_named_with_its_reason(store: Store, tmp_path: Path, origin) -> None:
    origin.put(f"/mirror/{W}", b"also wrong")
    origin.put(f"/gone/{W}", b"x", fault=Fault(status_sequence=[404] * 10))
    origin.put_file("/bad.carton", bad_zip(tmp_path, {W: [origin.url(f"/gone/{W}")]}))
    before = snapshot(store.root)
    with pytest.raises(ManifestMismatch) as info:
        pull(store, origin.url("/bad.carton"), fast_config(mirrors=(origin.url("/mirror"),)))
    msg = str(info.value)
    assert msg.startswith("model/w.bin: does not match MANIFEST: no source delivered its bytes (3 tried)"), msg
    lines = msg.splitlines()[1:]
    assert len(lines) == 3, msg
    assert lines[0].strip().startswith(origin.url("/bad.carton") + ": bytes hash to"), msg
    assert origin.url(f"/gone/{W}") in lines[1] and "404" in lines[1], msg
    assert lines[2].strip().startswith(origin.url(f"/mirror/{W}") + ": bytes hash to"), msg
    assert snapshot(store.root) == before and blob_files(store) == [] and tmp_files(store) == []


def test_with_no_other_source_the_error_names_the_carton_url(store: Store, tmp_path: Path, origin) -> None:
    origin.put_file("/bad.carton", bad_zip(tmp_path))
    message = refused_unchanged(store, origin.url("/bad.carton"))
    assert message.startswith(f"model/w.bin: does not match MANIFEST: {origin.url('/bad.carton')}: "
                              "bytes hash to sha256 "), message


def corrupt_zip(tmp_path: Path, links: dict[str, list[str]] | None = None, *,
                method: int = zipfile.ZIP_STORED, damaged: str = "model/w.bin") -> Path:
    """A carton whose ``damaged`` entry was damaged after it was written: its
    data no longer matches the CRC-32 (or, deflated, no longer decodes)."""
    path = write_zip(tmp_path / "corrupt.carton", carton_entries(
        GOOD, links=build_links(links) if links else None), method=method)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(damaged)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    data_at = info.header_offset + 30 + name_len + extra_len
    middle = data_at + info.compress_size // 2
    for i in range(middle - 4, middle + 4):   # within the entry's own data, whatever its size
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_an_entry_corrupt_on_the_way_comes_from_its_links_url(store: Store, tmp_path: Path, origin,
                                                             method: int) -> None:
    origin.put(f"/blobs/{W}", GOOD["model/w.bin"])
    origin.put_file("/corrupt.carton", corrupt_zip(tmp_path, {W: [origin.url(f"/blobs/{W}")]}, method=method))
    r = pull(store, origin.url("/corrupt.carton"))
    assert r.complete and r.digest == sha(manifest_for(GOOD))
    assert store.blobs.path(W).read_bytes() == GOOD["model/w.bin"]
    assert origin.count(f"/blobs/{W}") == 1
    assert store.verify().ok and tmp_files(store) == []


def test_a_corrupt_entry_with_no_other_source_names_what_was_wrong(store: Store, tmp_path: Path,
                                                                   origin) -> None:
    origin.put_file("/corrupt.carton", corrupt_zip(tmp_path))
    message = refused_unchanged(store, origin.url("/corrupt.carton"))
    assert message.startswith(f"model/w.bin: does not match MANIFEST: {origin.url('/corrupt.carton')}: "
                              "CRC-32 mismatch: the central directory says "), message


WRONG_TOML = MINIMAL_TOML + b"\n# not the carton.toml MANIFEST lists\n"


def wrong_toml_zip(tmp_path: Path) -> Path:
    """A carton whose carton.toml entry holds other (valid) bytes than MANIFEST lists."""
    return zip_with(tmp_path, "toml.carton", {"carton.toml": WRONG_TOML})


def test_a_small_file_with_wrong_bytes_and_no_other_source_fails_naming_it(
        store: Store, tmp_path: Path, origin) -> None:
    origin.put_file("/toml.carton", wrong_toml_zip(tmp_path))
    message = refused_unchanged(store, origin.url("/toml.carton"))
    assert message.startswith(f"carton.toml: does not match MANIFEST: {origin.url('/toml.carton')}: "
                              f"bytes hash to sha256 {sha(WRONG_TOML)}"), message


def test_a_small_file_from_another_source_is_recorded_at_its_own_size(store: Store, tmp_path: Path,
                                                                      origin) -> None:
    origin.put(f"/blobs/{sha(MINIMAL_TOML)}", MINIMAL_TOML)
    origin.put_file("/bad.carton", zip_with(tmp_path, "bad.carton", {"carton.toml": WRONG_TOML},
                                            {sha(MINIMAL_TOML): [origin.url(f"/blobs/{sha(MINIMAL_TOML)}")]}))
    r = pull(store, origin.url("/bad.carton"))
    entry = next(e for e in store.index.entries(r.digest) if e.path == "carton.toml")
    assert entry.size == len(MINIMAL_TOML) != len(WRONG_TOML)


def test_another_source_may_not_make_a_small_file_big(store: Store, tmp_path: Path, origin) -> None:
    big = b"x" * (16 << 20)   # what MANIFEST says carton.toml is, served at its LINKS URL
    origin.put(f"/blobs/{sha(big)}", big)
    path = write_zip(tmp_path / "big.carton", carton_entries(
        GOOD, manifest=manifest_for({**GOOD, "carton.toml": big}),
        links=build_links({sha(big): [origin.url(f"/blobs/{sha(big)}")]})))
    origin.put_file("/big.carton", path)
    message = refused_unchanged(store, origin.url("/big.carton"))
    assert "carton.toml" in message and origin.url(f"/blobs/{sha(big)}") in message, message


def symlink_zip(path: Path) -> Path:
    """A carton with model/alias.bin a symlink to w.bin: MANIFEST lists the
    hash of what it points to, the zip holds its target's name."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data in GOOD.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o100644 << 16
            z.writestr(info, data)
        link = zipfile.ZipInfo("model/alias.bin", date_time=(1980, 1, 1, 0, 0, 0))
        link.create_system = 3
        link.external_attr = 0o120777 << 16
        z.writestr(link, b"w.bin")
        z.writestr(zipfile.ZipInfo("MANIFEST", date_time=(1980, 1, 1, 0, 0, 0)),
                   manifest_for({**GOOD, "model/alias.bin": GOOD["model/w.bin"]}))
    return path


def test_a_symlink_is_not_taken_for_a_file_with_wrong_bytes(store: Store, tmp_path: Path, origin) -> None:
    origin.put(f"/mirror/{W}", GOOD["model/w.bin"])
    origin.put_file("/s.carton", symlink_zip(tmp_path / "s.carton"))
    r = pull(store, origin.url("/s.carton"), fast_config(mirrors=(origin.url("/mirror"),)))
    assert r.complete and origin.count(f"/mirror/{W}") == 0
    assert r.sources["url"]["blobs"] == r.blobs_fetched
    assert store.verify().ok and tmp_files(store) == []


@pytest.mark.slow
def test_an_entry_that_decodes_to_much_more_is_not_held_in_memory(store: Store, tmp_path: Path,
                                                                  origin) -> None:
    # Mostly zeros, one byte in 8001 not: deflates ~670:1 (under the zip bomb limit of 1000:1), so a
    # network chunk of it decodes to tens of MiB, and the whole entry to 128 MiB.
    sparse = bytearray(128 << 20)
    sparse[::8001] = bytes((i * 7919) % 251 + 1 for i in range(len(sparse[::8001])))
    files = {**GOOD, "model/w.bin": bytes(sparse)}
    origin.put_file("/zeros.carton", write_zip(tmp_path / "zeros.carton", carton_entries(files),
                                               method=zipfile.ZIP_DEFLATED))
    tracemalloc.start()
    try:
        r = pull(store, origin.url("/zeros.carton"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.complete and peak < 32 << 20, f"peak {peak >> 20} MiB traced while adding"


def test_a_small_file_corrupt_on_the_way_comes_from_its_links_url(store: Store, tmp_path: Path,
                                                                 origin) -> None:
    t = sha(GOOD["carton.toml"])
    origin.put(f"/blobs/{t}", GOOD["carton.toml"])
    origin.put_file("/corrupt.carton", corrupt_zip(tmp_path, {t: [origin.url(f"/blobs/{t}")]}, damaged="carton.toml"))
    r = pull(store, origin.url("/corrupt.carton"))
    assert r.complete and r.digest == sha(manifest_for(GOOD))
    assert store.blobs.path(t).read_bytes() == GOOD["carton.toml"] and origin.count(f"/blobs/{t}") == 1
    assert store.verify().ok and tmp_files(store) == []


@pytest.mark.parametrize("damaged,error", [("carton.toml", ManifestMismatch), ("MANIFEST", InvalidCarton)])
def test_a_corrupt_small_file_with_nothing_to_replace_it_names_the_damage(store: Store, tmp_path: Path,
                                                                         origin, damaged: str, error: type) -> None:
    origin.put_file("/corrupt.carton", corrupt_zip(tmp_path, damaged=damaged))
    message = refused_unchanged(store, origin.url("/corrupt.carton"), error=error)
    assert message.startswith(f"{damaged}: ") and "CRC-32 mismatch" in message, message


def bad_header_zip(tmp_path: Path, how: str, links: dict[str, list[str]] | None = None, *,
                   damaged: str = "model/w.bin") -> Path:
    """A carton whose ``damaged`` entry's local header was damaged after it
    was written: its signature (``how="signature"``), or the name it gives
    (``how="name"``: one letter changed, so not the central directory's)."""
    path = write_zip(tmp_path / "header.carton", carton_entries(GOOD, links=build_links(links) if links else None))
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(damaged)
    raw = bytearray(path.read_bytes())
    if how == "signature":
        raw[info.header_offset + 2] ^= 0x5A
    else:
        raw[info.header_offset + 30] ^= 0x01
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("how", ["signature", "name"])
@pytest.mark.parametrize("damaged", ["model/w.bin", "carton.toml"])   # an entry staged; a small file read first
def test_an_entry_whose_local_header_does_not_read_comes_from_its_links_url(
        store: Store, tmp_path: Path, origin, how: str, damaged: str) -> None:
    """Where its data starts is unknown: the entry is broken, the others in
    the same span are still read (it failed the whole add, exit 4)."""
    digest = sha(GOOD[damaged])
    origin.put(f"/blobs/{digest}", GOOD[damaged])
    origin.put_file("/header.carton", bad_header_zip(tmp_path, how, {digest: [origin.url(f"/blobs/{digest}")]},
                                                     damaged=damaged))
    r = pull(store, origin.url("/header.carton"))
    assert r.complete and r.digest == sha(manifest_for(GOOD))
    assert store.blobs.path(digest).read_bytes() == GOOD[damaged] and origin.count(f"/blobs/{digest}") == 1
    assert store.verify().ok and tmp_files(store) == []


@pytest.mark.parametrize("how,problem", [("signature", "no local file header at offset"),
                                         ("name", "unlike the central directory")])
def test_a_local_header_that_does_not_read_with_no_other_source_is_named(store: Store, tmp_path: Path, origin,
                                                                         how: str, problem: str) -> None:
    origin.put_file("/header.carton", bad_header_zip(tmp_path, how))
    message = refused_unchanged(store, origin.url("/header.carton"))
    assert message.startswith(f"model/w.bin: does not match MANIFEST: {origin.url('/header.carton')}: "), message
    assert problem in message, message


NEXT = {**GOOD, "model/x.bin": b"next entry " * 1000}   # read in the same span, right after model/w.bin


@pytest.mark.parametrize("field,value,problem", [
    ("extra", 100, "extra field (100 bytes) runs its data past the next entry"),
    ("extra", 6000, "extra field (6000 bytes) runs its data past the next entry"),
    ("name", 0xFFFF, "local header gives a 65535-byte name, the central directory a 11-byte one"),
])
def test_a_local_header_whose_lengths_do_not_fit_breaks_only_its_entry(store: Store, tmp_path: Path, origin,
                                                                       field: str, value: int, problem: str) -> None:
    """A damaged name or extra length would have the parser take the next
    entry's bytes for this one's (the next was then named broken, or the
    span read again and again): the entry is broken before its data, and
    the next one is read as it is."""
    path = write_zip(tmp_path / "lengths.carton", carton_entries(NEXT))
    with zipfile.ZipFile(path) as z:
        w, x = z.getinfo("model/w.bin"), z.getinfo("model/x.bin")
    assert x.header_offset > w.header_offset
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, w.header_offset + (28 if field == "extra" else 26), value)
    path.write_bytes(bytes(raw))
    origin.put_file("/lengths.carton", path)
    message = refused_unchanged(store, origin.url("/lengths.carton"))
    assert message.startswith(f"model/w.bin: does not match MANIFEST: {origin.url('/lengths.carton')}: "), message
    assert problem in message and "model/x.bin" not in message, message
    assert origin.count("/lengths.carton") <= 4   # tail, central directory, one span: not read again and again
