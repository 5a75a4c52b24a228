"""Reading TOML files of a carton: decoding, and typed access to fields with
errors that name the file and the field.

tomli's own exceptions (TOMLDecodeError, and RecursionError for deeply nested
values) and UnicodeDecodeError are translated into InvalidCarton here, once,
so that the format modules only ever raise InvalidCarton.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, TypeGuard

from cartonstore.errors import InvalidCarton

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def load_toml(raw: bytes, file: str) -> dict[str, Any]:
    """Parse ``raw`` as a UTF-8 TOML document.

    Raises InvalidCarton(file, ...) naming the line when the bytes are not
    UTF-8 or not TOML.
    """
    text = decode_utf8(raw, file)
    import tomli  # imported here: manifest.py, loaded by every command, needs only decode_utf8

    try:
        document = tomli.loads(text)
    except tomli.TOMLDecodeError as e:
        raise InvalidCarton(file, f"is not valid TOML: {e.msg}", field=f"line {e.lineno}") from None
    except RecursionError:
        raise InvalidCarton(file, "is not valid TOML: values are nested too deeply") from None
    except ValueError:  # Python refuses to convert integers of over 4300 digits
        raise InvalidCarton(file, "is not valid TOML: a number has too many digits") from None
    _check_int_range(document, file)
    return document


def _check_int_range(document: dict[str, Any], file: str) -> None:
    """TOML integers are signed 64-bit; tomli does not enforce it, the spec does."""
    # Iterative: table headers like [a.b.c...] nest deeper than Python recurses.
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((join_field(where, key), child) for key, child in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(value))
        elif is_int(value) and not _INT64_MIN <= value <= _INT64_MAX:
            raise InvalidCarton(
                file, f"is not valid TOML: {value} does not fit in 64 bits", field=where
            )


def decode_utf8(raw: bytes, file: str) -> str:
    """Decode ``raw`` as strict UTF-8; InvalidCarton names the line of the bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InvalidCarton(
            file, f"is not valid UTF-8 (bad byte at offset {e.start})", field=f"line {line}"
        ) from None


def type_name(value: object) -> str:
    """How a user would name the TOML/JSON type of ``value`` ("an integer")."""
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (datetime.date, datetime.time)):
        return "a date/time"
    return "null" if value is None else type(value).__name__


def is_int(value: object) -> TypeGuard[int]:
    """True for a real integer (TOML and JSON booleans are not integers)."""
    return isinstance(value, int) and not isinstance(value, bool)


def join_field(prefix: str, key: str) -> str:
    """``prefix.key``, quoting keys that are not bare TOML keys."""
    part = key if _BARE_KEY.fullmatch(key) else repr(key)
    return f"{prefix}.{part}" if prefix else part


class TomlTable:
    """One table of a parsed TOML file, read with typed getters.

    ``prefix`` is the table's field path ("input[1]", "runner"); every getter
    raises InvalidCarton naming ``file`` and ``prefix.key``.
    """

    def __init__(self, data: dict[str, Any], file: str, prefix: str = "") -> None:
        self.data = data
        self.file = file
        self.prefix = prefix

    def field(self, key: str) -> str:
        return join_field(self.prefix, key)

    def error(self, key: str, problem: str) -> InvalidCarton:
        return InvalidCarton(self.file, problem, field=self.field(key))

    def require(self, key: str) -> Any:
        if key not in self.data:
            raise self.error(key, "is required but missing")
        return self.data[key]

    def opt_str(self, key: str, *, non_empty: bool = False) -> str | None:
        if key not in self.data:
            return None
        return self.req_str(key, non_empty=non_empty)

    def req_str(self, key: str, *, non_empty: bool = False) -> str:
        value = self.require(key)
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, not {type_name(value)}")
        if non_empty and not value:
            raise self.error(key, "must not be empty")
        return value

    def opt_int(self, key: str, *, minimum: int | None = None) -> int | None:
        if key not in self.data:
            return None
        return self.req_int(key, minimum=minimum)

    def req_int(self, key: str, *, minimum: int | None = None) -> int:
        value = self.require(key)
        if not is_int(value):
            raise self.error(key, f"must be an integer, not {type_name(value)}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be at least {minimum}, not {value}")
        return value

    def opt_table(self, key: str) -> TomlTable | None:
        if key not in self.data:
            return None
        return self.req_table(key)

    def req_table(self, key: str) -> TomlTable:
        value = self.require(key)
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table, not {type_name(value)}")
        return TomlTable(value, self.file, self.field(key))

    def opt_list(self, key: str) -> list[Any] | None:
        if key not in self.data:
            return None
        value = self.data[key]
        if not isinstance(value, list):
            raise self.error(key, f"must be an array, not {type_name(value)}")
        return value

    def opt_str_list(self, key: str) -> list[str] | None:
        values = self.opt_list(key)
        for i, value in enumerate(values or ()):
            if not isinstance(value, str):
                raise InvalidCarton(
                    self.file,
                    f"must be a string, not {type_name(value)}",
                    field=f"{self.field(key)}[{i}]",
                )
        return values

    def opt_tables(self, key: str) -> list[TomlTable] | None:
        """An array of tables (``[[key]]``), or None when absent."""
        values = self.opt_list(key)
        if values is None:
            return None
        tables = []
        for i, value in enumerate(values):
            field = f"{self.field(key)}[{i}]"
            if not isinstance(value, dict):
                raise InvalidCarton(
                    self.file, f"must be a table ([[{key}]]), not {type_name(value)}", field=field
                )
            tables.append(TomlTable(value, self.file, field))
        return tables
