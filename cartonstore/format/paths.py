"""Paths inside a carton: relative, posix, and unable to escape their folder.

Every path that comes from a carton (zip entry names, MANIFEST lines,
tensor_data files, misc references, symlink targets) passes through here
before anything uses it to name a file on disk (DESIGN invariant 7). All of
it is string work; nothing here touches the filesystem.
"""

from __future__ import annotations

import posixpath
import re

from cartonstore.errors import InvalidCarton

# Control characters confuse terminals and logs and have no business in a
# file name; surrogates mean the name was not valid UTF-8 to begin with.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def carton_path_problem(name: object) -> str | None:
    """Why ``name`` is not an acceptable carton path, or None when it is."""
    if not isinstance(name, str):
        return "is not a string"
    if not name:
        return "is empty"
    return _text_problem(name) or _structure_problem(name)


def _text_problem(name: str) -> str | None:
    if _SURROGATE.search(name):
        return "is not valid UTF-8"
    control = _CONTROL.search(name)
    if control:
        return f"contains a control character ({control.group()!r})"
    if "\\" in name:
        return "contains a backslash; carton paths use '/'"
    return None


def _structure_problem(name: str) -> str | None:
    if name.startswith("/"):
        return "is absolute; carton paths are relative"
    if ":" in name.split("/", 1)[0]:
        return "starts with a drive letter or scheme (a ':' in its first component)"
    if name.endswith("/"):
        return "ends with '/'; it must name a file"
    for component in name.split("/"):
        if component == "":
            return "has an empty component ('//')"
        if component in (".", ".."):
            return f"has a {component!r} component"
    return None


def is_valid_carton_path(name: object) -> bool:
    """True when validate_carton_path would accept ``name``."""
    return carton_path_problem(name) is None


def validate_carton_path(
    name: str, *, file_for_errors: str | None = None, field: str | None = None
) -> str:
    """Return ``name`` unchanged if it is a safe relative posix path.

    Rejects empty names, absolute paths, '.', '..' and empty components,
    a trailing '/', backslashes, drive letters or any ':' in the first
    component, control characters and invalid UTF-8.

    Raises InvalidCarton naming ``file_for_errors`` (the file the path was
    read from, e.g. "MANIFEST") and ``field``; without ``file_for_errors`` the
    error is about the path itself.
    """
    problem = carton_path_problem(name)
    if problem is None:
        return name
    if file_for_errors is None:
        raise InvalidCarton(_printable(name), f"is not an allowed path in a carton: it {problem}")
    raise InvalidCarton(file_for_errors, f"path {name!r} {problem}", field=field)


def _printable(name: object) -> str:
    text = name if isinstance(name, str) else repr(name)
    if _CONTROL.search(text) or _SURROGATE.search(text) or not text:
        return repr(text)
    return text


def is_within(base_dir_relpath: str, target_relpath: str) -> bool:
    """True if ``target_relpath`` lies in ``base_dir_relpath`` (or is it).

    Both are carton-relative paths compared lexically after normalization
    (posixpath.normpath); an absolute target, or one that climbs out of the
    carton with '..', is never within. A base of "" or "." is the whole carton.
    """
    if target_relpath.startswith("/") or base_dir_relpath.startswith("/"):
        return False
    target = posixpath.normpath(target_relpath)
    if target == ".." or target.startswith("../"):
        return False
    base = posixpath.normpath(base_dir_relpath)
    if base == ".":
        return True
    return target == base or target.startswith(base + "/")


def resolve_symlink_target(link_path: str, target: str) -> str:
    """The carton path a relative symlink at ``link_path`` points to.

    ``target`` is resolved against the link's directory the way
    posixpath.normpath would, without looking at the filesystem (so a '..'
    after a component that is itself a link is resolved lexically; callers
    must check links component by component if they follow them).

    The result must stay strictly inside the top-level folder of the link
    ("model/..." links resolve under "model/"); a link at the top level may
    point anywhere inside the carton. Raises InvalidCarton (file = the link,
    field "symlink target") for absolute or empty targets, targets that
    escape, and a link that points at itself or at a folder holding it.
    """
    validate_carton_path(link_path)

    def fail(problem: str) -> InvalidCarton:
        return InvalidCarton(link_path, problem, field="symlink target")

    if not target:
        raise fail("is empty")
    text_problem = _text_problem(target)
    if text_problem:
        raise fail(f"{target!r} {text_problem}")
    if target.startswith("/"):
        raise fail(f"{target!r} is absolute; links in a carton must be relative")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link_path), target))
    top = link_path.split("/", 1)[0] if "/" in link_path else ""
    if not _strictly_inside(top, resolved):
        where = f"{top}/" if top else "the carton"
        raise fail(f"{target!r} resolves to {resolved!r}, outside {where}")
    if resolved == link_path or link_path.startswith(resolved + "/"):
        # A link to itself or to a folder holding it makes a loop for anyone
        # who walks the tree following links.
        raise fail(f"{target!r} points at the link itself or a folder holding it")
    return validate_carton_path(resolved, file_for_errors=link_path, field="symlink target")


def _strictly_inside(top: str, resolved: str) -> bool:
    if resolved in (".", "..") or resolved.startswith("../"):
        return False
    return not top or resolved.startswith(top + "/")
