"""Carton paths: what validate_carton_path accepts and rejects, is_within and symlinks."""

from __future__ import annotations

import pytest

from cartonstore.errors import InvalidCarton
from cartonstore.format.paths import (
    is_valid_carton_path,
    is_within,
    resolve_symlink_target,
    validate_carton_path,
)

GOOD = [
    "carton.toml",
    "model/weights.safetensors",
    "misc/my picture (1).png",
    "model/a=b/c.txt",
    "model/.carton/carton.lock",
    "model/..hidden",
    "model/x..y",
    "tensor_data/tensor_0.bin",
    "model/über/日本.txt",
    "model/a:b",  # ':' is only refused in the first component
]

BAD = [
    ("", "is empty"),
    ("/etc/passwd", "is absolute"),
    ("/MANIFEST", "is absolute"),
    ("../x", "'..' component"),
    ("model/../../x", "'..' component"),
    ("model/..", "'..' component"),
    ("./x", "'.' component"),
    ("model/./x", "'.' component"),
    ("model//x", "empty component"),
    ("model/", "ends with '/'"),
    ("model\\x", "backslash"),
    ("C:/x", "drive letter"),
    ("C:x", "drive letter"),
    ("http://host/x", "drive letter or scheme"),
    ("model/a\x00b", "control character"),
    ("model/a\nb", "control character"),
    ("model/a\x1fb", "control character"),
    ("model/a\x7fb", "control character"),
    ("model/\udcff", "not valid UTF-8"),
]


@pytest.mark.parametrize("name", GOOD)
def test_accepts_good_paths(name: str) -> None:
    assert validate_carton_path(name) == name
    assert is_valid_carton_path(name)


@pytest.mark.parametrize(("name", "problem"), BAD)
def test_rejects_bad_paths(name: str, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem):
        validate_carton_path(name)
    assert not is_valid_carton_path(name)


def test_error_names_the_file_and_field_it_came_from() -> None:
    with pytest.raises(InvalidCarton, match=r"^MANIFEST: line 3: path '\.\./x' has a '\.\.' component") as info:
        validate_carton_path("../x", file_for_errors="MANIFEST", field="line 3")
    assert info.value.file == "MANIFEST"
    assert info.value.field == "line 3"


def test_error_without_a_file_is_about_the_path_and_printable() -> None:
    with pytest.raises(InvalidCarton, match="not an allowed path") as info:
        validate_carton_path("a\nb")
    assert "\n" not in str(info.value)


def test_rejects_non_strings() -> None:
    assert not is_valid_carton_path(None)
    with pytest.raises(InvalidCarton, match="is not a string"):
        validate_carton_path(3)  # type: ignore[arg-type]  # a wrong type on purpose


@pytest.mark.parametrize(
    ("base", "target", "expected"),
    [
        ("model", "model/a/b", True),
        ("model", "model", True),
        ("model", "model/a/../b", True),
        ("model", "modelx/a", False),
        ("model", "model/../misc/x", False),
        ("model", "misc/x", False),
        ("model", "/model/x", False),
        ("", "anything/x", True),
        (".", "a", True),
        ("", "../x", False),
        ("model/sub", "model/sub/x", True),
        ("model/sub", "model/x", False),
    ],
)
def test_is_within(base: str, target: str, expected: bool) -> None:
    assert is_within(base, target) is expected


@pytest.mark.parametrize(
    ("link", "target", "expected"),
    [
        ("model/a/link", "../b/file", "model/b/file"),
        ("model/link", "weights.bin", "model/weights.bin"),
        ("model/a/link", "./x/../y", "model/a/y"),
        ("model/a/b/link", "../../c", "model/c"),
        ("link", "model/x", "model/x"),
    ],
)
def test_resolve_symlink_target(link: str, target: str, expected: str) -> None:
    assert resolve_symlink_target(link, target) == expected


@pytest.mark.parametrize(
    ("link", "target", "problem"),
    [
        ("model/link", "/etc/passwd", "is absolute"),
        ("model/link", "../misc/x", "resolves to 'misc/x', outside model/"),
        ("model/a/link", "../../../x", "outside model/"),
        ("model/link", "..", "outside model/"),
        ("link", "../x", "outside the carton"),
        ("link", ".", "outside the carton"),
        ("model/link", "", "is empty"),
        ("model/link", "a\\b", "backslash"),
        ("model/link", "a\x00", "control character"),
        ("model/link", "link", "points at the link itself"),
        ("model/a/b/link", "..", "a folder holding it"),
    ],
)
def test_resolve_symlink_target_rejects_escapes(link: str, target: str, problem: str) -> None:
    with pytest.raises(InvalidCarton, match=problem) as info:
        resolve_symlink_target(link, target)
    assert info.value.file == link
    assert info.value.field == "symlink target"


def test_resolve_symlink_target_rejects_a_bad_link_path() -> None:
    with pytest.raises(InvalidCarton, match="'..' component"):
        resolve_symlink_target("../link", "x")
