"""MANIFEST parsing and building."""

from __future__ import annotations

import hashlib
import re

import pytest

from cartonstore.errors import InvalidCarton
from cartonstore.format.manifest import Manifest, build_manifest, is_sha256, parse_manifest

A = "a" * 64
B = "b" * 64
C = "0123456789abcdef" * 4


def lines(*entries: str) -> bytes:
    return "".join(f"{entry}\n" for entry in entries).encode("utf-8")


VALID = lines(f"carton.toml={A}", f"model/model.pt={B}", f"tensor_data/index.toml={C}")


def test_parses_entries_digest_and_paths() -> None:
    manifest = parse_manifest(VALID)
    assert isinstance(manifest, Manifest)
    assert manifest.raw == VALID
    assert manifest.entries == (
        ("carton.toml", A),
        ("model/model.pt", B),
        ("tensor_data/index.toml", C),
    )
    assert manifest.paths == ("carton.toml", "model/model.pt", "tensor_data/index.toml")
    assert manifest.as_dict() == {"carton.toml": A, "model/model.pt": B, "tensor_data/index.toml": C}
    assert manifest.digest == hashlib.sha256(VALID).hexdigest()


def test_path_may_contain_equals_signs() -> None:
    manifest = parse_manifest(lines(f"carton.toml={A}", f"model/a=b={B}"))
    assert manifest.as_dict()["model/a=b"] == B


def test_sorting_is_by_utf8_bytes_not_by_code_point_or_case() -> None:
    # "Z" (0x5A) < "a" (0x61) < "é" (0xC3 0xA9): byte order, case-sensitive.
    raw = lines(f"Zeta={A}", f"carton.toml={A}", f"model/a={A}", f"model/é={A}", f"model/\U0001f600={A}")
    assert parse_manifest(raw).paths[0] == "Zeta"


BAD = [
    (b"", None, "is empty"),
    (f"carton.toml={A}".encode(), "line 1", "does not end with a newline"),
    (lines(f"carton.toml={A}") + b"model/x", "line 2", "does not end with a newline"),
    (f"carton.toml={A}\r\n".encode(), "line 1", r"'\\r\\n'"),
    (lines(f"carton.toml={A}", "model/x"), "line 2", "expected 'path=sha256'"),
    (lines(f"carton.toml={A}", ""), "line 2", "expected 'path=sha256'"),
    (lines(f"carton.toml={A}", f"model/x={A.upper()}"), "line 2", "must be lowercase"),
    (lines(f"carton.toml={A}", f"model/x={A[:-1]}"), "line 2", "not 64 hex digits"),
    (lines(f"carton.toml={A}", f"model/x={A} "), "line 2", "not 64 hex digits"),
    (lines(f"carton.toml={A}", f"model/x ={A}"), None, None),  # a space in a path is fine
    (lines(f"carton.toml={A}", f"={A}"), "line 2", "is empty"),
    (lines(f"../x={A}", f"carton.toml={A}"), "line 1", "'..' component"),
    (lines(f"/abs={A}", f"carton.toml={A}"), "line 1", "is absolute"),
    (lines(f"carton.toml={A}", f"model\\x={A}"), "line 2", "backslash"),
    (lines(f"carton.toml={A}", f"model//x={A}"), "line 2", "empty component"),
    (lines(f"LINKS={A}", f"carton.toml={A}"), "line 1", "must not list LINKS"),
    (lines(f"MANIFEST={A}", f"carton.toml={A}"), "line 1", "must not list MANIFEST"),
    (lines(f"carton.toml={A}", f"carton.toml={B}"), "line 2", "duplicate entry"),
    (lines(f"model/x={A}", f"carton.toml={A}"), "line 2", "out of order"),
    (lines(f"model/x={A}"), None, "does not list carton.toml"),
    (lines(f"carton.toml={A}", f"model={A}", f"model/x={A}"), "line 3", "inside 'model'"),
    (b"carton.toml=\xff\n", "line 1", "not valid UTF-8"),
    (lines(f"carton.toml={A}") + b"model/\xc3=" + A.encode() + b"\n", "line 2", "not valid UTF-8"),
]


@pytest.mark.parametrize(("raw", "field", "problem"), BAD)
def test_rejects_bad_manifests(raw: bytes, field: str | None, problem: str | None) -> None:
    if problem is None:
        assert parse_manifest(raw).entries
        return
    with pytest.raises(InvalidCarton, match=problem) as info:
        parse_manifest(raw)
    assert info.value.file == "MANIFEST"
    assert info.value.field == field
    assert str(info.value).startswith("MANIFEST: ")


def test_build_sorts_by_bytes_and_round_trips() -> None:
    files = {"model/é": B, "model/z": A, "carton.toml": C, "Zeta": A}
    raw = build_manifest(files)
    assert raw == lines(f"Zeta={A}", f"carton.toml={C}", f"model/z={A}", f"model/é={B}")
    assert parse_manifest(raw).as_dict() == files


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ({"carton.toml": A, "../x": A}, "'..' component"),
        ({"carton.toml": A, "model/x": "nothex"}, "not 64 hex digits"),
        ({"carton.toml": A.upper()}, "must be lowercase"),
        ({"carton.toml": A, "LINKS": A}, "must not list LINKS"),
        ({"model/x": A}, "does not list carton.toml"),
        ({"carton.toml": A, "model": A, "model/x": A}, "inside 'model'"),
        ({"carton.toml": 5}, "must be a string"),
    ],
)
def test_build_validates(files: dict, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        build_manifest(files)
    assert info.value.file == "MANIFEST"


@pytest.mark.parametrize(
    ("value", "expected"),
    [(A, True), (C, True), (A.upper(), False), (A[:-1], False), (A + "0", False), ("g" * 64, False), (None, False)],
)
def test_is_sha256(value: object, expected: bool) -> None:
    assert is_sha256(value) is expected


def test_digest_names_the_exact_bytes() -> None:
    manifest = parse_manifest(VALID)
    assert re.fullmatch("[0-9a-f]{64}", manifest.digest)
    assert manifest.digest == manifest.digest  # cached, stable
    assert parse_manifest(lines(f"carton.toml={B}")).digest != manifest.digest
