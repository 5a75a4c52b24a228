"""LINKS parsing and building."""

from __future__ import annotations

import pytest

from cartonstore.errors import InvalidCarton
from cartonstore.format.links import build_links, parse_links

A = "e550f6224a5133f597d823ab4590f369e0b20e3c6446488225fc6f7a372b9fe2"
B = "f" * 64


def test_parses_the_spec_example() -> None:
    raw = f'version = 1\n\n[urls]\n{A} = ["https://example.com/file"]\n'.encode()
    assert parse_links(raw) == {A: ("https://example.com/file",)}


def test_keeps_url_order_and_ignores_unknown_keys() -> None:
    raw = f'version = 1\nfuture = "x"\n[urls]\n{A} = ["https://a/1", "https://b/2"]\n{B} = ["s3://x"]\n'
    assert parse_links(raw.encode()) == {A: ("https://a/1", "https://b/2"), B: ("s3://x",)}


def test_empty_urls_table_is_fine() -> None:
    assert parse_links(b"version = 1\n[urls]\n") == {}


BAD = [
    (b"[urls]\n", "version", "is required but missing"),
    (b"version = 2\n[urls]\n", "version", "unsupported LINKS version 2"),
    (b'version = "1"\n[urls]\n', "version", "unsupported LINKS version '1'"),
    (b"version = true\n[urls]\n", "version", "unsupported LINKS version True"),
    (b"version = 1\n", "urls", "is required but missing"),
    (b"version = 1\nurls = 3\n", "urls", "must be a table"),
    (f'version = 1\n[urls]\n{A.upper()} = ["https://x"]\n'.encode(), f"urls.{A.upper()}", "must be lowercase"),
    (b'version = 1\n[urls]\nabc = ["https://x"]\n', "urls.abc", "not 64 hex digits"),
    (f'version = 1\n[urls]\n{A} = "https://x"\n'.encode(), f"urls.{A}", "must be an array of URLs, not a string"),
    (f"version = 1\n[urls]\n{A} = []\n".encode(), f"urls.{A}", "at least one URL"),
    (f'version = 1\n[urls]\n{A} = [""]\n'.encode(), f"urls.{A}[0]", "not an empty string"),
    (f'version = 1\n[urls]\n{A} = ["https://x", 3]\n'.encode(), f"urls.{A}[1]", "not an integer"),
    (f'version = 1\n[urls]\n{A} = ["https://x/\\n"]\n'.encode(), f"urls.{A}[0]", "control character"),
    (b"version = 1\n[urls\n", "line 2", "not valid TOML"),
    (b"version = 1\n\xff\n", "line 2", "not valid UTF-8"),
]


@pytest.mark.parametrize(("raw", "field", "problem"), BAD)
def test_rejects_bad_links(raw: bytes, field: str, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        parse_links(raw)
    assert info.value.file == "LINKS"
    assert info.value.field == field


def test_build_sorts_keys_and_round_trips() -> None:
    urls = {B: ["https://b"], A: ("https://a/1", "https://a/2")}
    raw = build_links(urls)
    assert raw.index(A.encode()) < raw.index(B.encode())
    assert raw.startswith(b"version = 1\n")
    assert parse_links(raw) == {A: ("https://a/1", "https://a/2"), B: ("https://b",)}


@pytest.mark.parametrize(
    ("urls", "problem"),
    [
        ({"nothex": ["https://x"]}, "not 64 hex digits"),
        ({A: []}, "at least one URL"),
        ({A: "https://x"}, "must be an array"),
        ({A: [""]}, "not an empty string"),
    ],
)
def test_build_validates(urls: dict, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        build_links(urls)
    assert info.value.file == "LINKS"
