"""What one commit adds to the store's figures by kind of source (pure):
fresh blobs by the kind each came from, the rest the store had as reused
by the source's kind, the files a source made itself in neither."""

from __future__ import annotations

from pathlib import Path

from cartonstore.store.content.blobs import StagedBlob
from cartonstore.store.ingest import Provenance, source_figures
from cartonstore.store.metadata.source_bytes import SourceBytes

A, B, C, MADE, HAD = ("a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64)


def staged(digest: str, size: int, origin: str | None = None) -> StagedBlob:
    return StagedBlob(digest, size, Path("/nonexistent") / digest, origin)


FRESH = {A: staged(A, 100), B: staged(B, 20, "peer"), C: staged(C, 3, "mirror"), MADE: staged(MADE, 7)}
PRESENT = {A: 100, B: 20, C: 3, MADE: 7, HAD: 5000}


def test_fresh_blobs_count_for_their_origin_and_those_the_store_had_as_reused() -> None:
    assert sorted(source_figures(Provenance("oci", frozenset({MADE})), FRESH, PRESENT), key=lambda f: f.kind) == [
        SourceBytes("mirror", 3, 1), SourceBytes("oci", 100, 1, 5000, 1), SourceBytes("peer", 20, 1)]


def test_a_file_the_source_made_counts_neither_way_even_when_the_store_had_it() -> None:
    figures = source_figures(Provenance("hf", frozenset({HAD})), {}, {HAD: 5000, A: 100})
    assert figures == [SourceBytes("hf", 0, 0, 100, 1)]


def test_a_whole_download_reuses_nothing() -> None:
    assert sorted(source_figures(Provenance("url", whole=True), FRESH, PRESENT), key=lambda f: f.kind) == [
        SourceBytes("mirror", 3, 1), SourceBytes("peer", 20, 1), SourceBytes("url", 100 + 7 + 5000, 3)]
