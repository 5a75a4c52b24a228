"""The kinds of value a setting takes (integers, sizes, durations, choices,
booleans, paths, lists of strings): how each is read from TOML, the
environment or the command line, and how it is written back. Shared by
load.py and the section modules (server.py, fetch.py, peers.py, ...); a parser raises BadValue (or
InvalidInput) and the loader says where the value came from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import field
from pathlib import Path, PurePath
from typing import Any
from urllib.parse import urlsplit

from cartonstore.errors import InvalidInput
from cartonstore.fetch.http.policy import UrlPolicy, describe
from cartonstore.format.units import parse_duration, parse_size

Parser = Callable[[Any], Any]
Shower = Callable[[Any], Any]


class BadValue(Exception):
    """A value a parser refuses; the loader says where it came from."""


DEFAULT = object()  # a parser's answer for "" where the default is computed


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    return None


def integer(minimum: int) -> Parser:
    def parse(value: object) -> int:
        number = _as_int(value)
        if number is None or number < minimum:
            raise BadValue(f"expected an integer >= {minimum}, got {value!r}")
        return number
    return parse


def _as_size(value: object) -> int | None:
    if isinstance(value, str):
        try:
            return parse_size(value)
        except InvalidInput:
            return None
    return _as_int(value)


def size(minimum: int, *, optional: bool = False) -> Parser:
    empty = ' (or "" for no limit)' if optional else ""

    def parse(value: object) -> int | None:
        if optional and value == "":
            return None
        number = _as_size(value)
        if number is None:
            raise BadValue(f"expected a size such as 512MiB, 10GiB or 1000000{empty}, got {value!r}")
        if number < minimum:
            raise BadValue(f"expected a size >= {minimum}{empty}, got {value!r}")
        return number
    return parse


def _as_seconds(value: object) -> float | None:
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except InvalidInput:
            return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def duration(*, positive: bool) -> Parser:
    def parse(value: object) -> float:
        seconds = _as_seconds(value)
        if seconds is None:
            raise BadValue(f"expected a duration such as 90, 30s, 10m or 1h30m, got {value!r}")
        if seconds < 0 or (positive and seconds == 0):
            raise BadValue(f"expected a duration {'> 0' if positive else '>= 0'}, got {value!r}")
        return seconds
    return parse


def choice(*choices: str) -> Parser:
    def parse(value: object) -> str:
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise BadValue(f"expected one of {', '.join(map(repr, choices))}, got {value!r}")
    return parse


_BOOLEANS = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}


def boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLEANS:
        return _BOOLEANS[value.strip().lower()]
    raise BadValue(f"expected true or false, got {value!r}")


def tolerance(value: object) -> float:
    """A comparison tolerance: a finite number >= 0 (1e-5, "0.001")."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None or not math.isfinite(number) or number < 0:
        raise BadValue(f"expected a number >= 0 such as 1e-5, got {value!r}")
    return number


def path(*, empty: object) -> Parser:
    """A path with ~ expanded; ``empty`` is what "" means. The loader makes
    relative paths absolute."""
    def parse(value: object) -> object:
        if value == "":
            return empty
        if not isinstance(value, (str, PurePath)) or "\0" in str(value):
            raise BadValue(f'expected a path (or "" for the default), got {value!r}')
        return Path(value).expanduser()
    return parse


def strings(check: Callable[[tuple[str, ...]], object] | None = None) -> Parser:
    def parse(value: object) -> tuple[str, ...]:
        if not isinstance(value, (list, tuple)) or not all(isinstance(i, str) for i in value):
            # describe() keeps credentials in a mistyped mirror URL out of the message
            got = repr(describe(value)) if isinstance(value, str) else repr(value)
            raise BadValue(f"expected a list of strings, got {got}")
        if check is not None:
            check(tuple(value))  # raises InvalidInput naming the problem
        return tuple(value)
    return parse


def show(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def show_path(path: Path | None) -> str:
    return "" if path is None else str(path)


def size_text(size: int | None) -> str:
    """``size`` the way a config file writes it: "256MiB", "1000"; "" for None."""
    if size is None:
        return ""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def duration_text(seconds: float) -> str:
    """``seconds`` the way a config file writes it: "1h30m", "10s", "0.25s"."""
    if seconds != int(seconds):
        text = repr(seconds)
        return (f"{seconds:.9f}".rstrip("0") if "e" in text else text) + "s"
    rest, parts = int(seconds), []
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, length)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def setting(default: Any, parse: Parser, show_as: Shower = show, *,
            factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field that knows how to read its value and how to show it."""
    metadata = {"parse": parse, "show": show_as}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def size_setting(default: int | None, minimum: int, *, optional: bool = False) -> Any:
    return setting(default, size(minimum, optional=optional), size_text)


def duration_setting(default: float, *, positive: bool) -> Any:
    return setting(default, duration(positive=positive), duration_text)


# -- secrets ----------------------------------------------------------------------


def _is_token(text: str) -> bool:
    """It goes in an Authorization header as it is: printable ASCII, no spaces."""
    return text.isascii() and text.isprintable() and not any(c.isspace() for c in text)


def token(value: object) -> str:
    if not isinstance(value, str) or not _is_token(value):
        raise BadValue("expected a token as a string of printable ASCII without spaces")
    return value


SECRET_SHOWN = "(set; not shown)"


def show_secret(value: str) -> str:
    """A token as the settings are shown (--print-config, logs): whether it
    is set, never its characters."""
    return SECRET_SHOWN if value else ""


def token_setting() -> Any:
    """A token's setting: read as a token, shown as set or not, never its
    characters."""
    return setting("", token, show_secret)


def read_token(path: Path, key: str) -> str:
    """The one token in a file (a secret kept out of the settings file)."""
    try:
        text = path.read_text().strip()
    except OSError as e:
        raise InvalidInput(f"{key} {path}: cannot read it ({e.strerror})", subject=str(path)) from None
    except UnicodeDecodeError:
        text = "\0"   # refused below, as any other unusable content
    if not text or not _is_token(text):
        raise InvalidInput(f"{key} {path}: expected one token without spaces", subject=str(path))
    return text


def url_prefix(url: str, *, what: str, path: bool = True) -> str:
    """url as a prefix other paths are put after: a URL the fetch policy
    takes, with no query or fragment (and no path when ``path`` is false).
    ``what`` says what it is and where those paths go, for the refusal."""
    try:
        UrlPolicy().check(url)
    except InvalidInput as e:
        raise BadValue(f"{what}: {e}") from None
    parts = urlsplit(url)
    if "?" in url or "#" in url or (not path and parts.path not in ("", "/")):
        kept_out = "a query or fragment" if path else "a path, query or fragment"
        raise BadValue(f"{what}, so it cannot have {kept_out}: {describe(url)}")
    return url.rstrip("/")
