"""carton.toml: the model's description, inputs and outputs, test data and runner.

parse_carton_toml checks every field the v1 spec defines, by type and by
meaning, and ignores fields and tables it does not know (the spec promises
that, so newer writers can add data without a spec_version bump).
check_references then checks what the file points at against the MANIFEST and
tensor_data/index.toml.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from cartonstore.errors import InvalidCarton

from ._toml import TomlTable, is_int, join_field, load_toml, type_name
from .dtypes import CARTON_DTYPES
from .paths import validate_carton_path

CARTON_TOML = "carton.toml"
SPEC_VERSION = 1
SHORT_DESCRIPTION_MAX = 100
TENSOR_PREFIX = "@tensor_data/"
MISC_PREFIX = "@misc/"

# A shape is "not given" (None), one string for the whole shape (a symbol,
# or "*" for any shape), or one entry per dimension (an int or a symbol).
Shape = str | tuple[int | str, ...] | None

# Loose forms of what Carton parses strictly with the semver and
# target-lexicon crates: enough to catch typos and wrong fields, never
# stricter than Carton, so no carton it loads is refused here.
_VERSION_PART = r"(?:\*|[xX]|\d+)"
_VERSION_REQ = re.compile(
    rf"(?:=|>=|<=|>|<|~|\^)?\s*(?:\*|{_VERSION_PART}(?:\.{_VERSION_PART}"
    rf"(?:\.{_VERSION_PART}(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?)?)?)"
)
_TARGET_TRIPLE = re.compile(r"[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)+")


@dataclass(frozen=True)
class TensorSpec:
    """One [[input]] or [[output]]."""

    name: str
    dtype: str
    shape: Shape
    description: str | None = None
    internal_name: str | None = None


@dataclass(frozen=True)
class SelfTest:
    """One [[self_test]]; values are references as written ("@tensor_data/t")."""

    name: str | None
    description: str | None
    inputs: dict[str, str] = field(hash=False)
    expected_out: dict[str, str] | None = field(hash=False)


@dataclass(frozen=True)
class Example:
    """One [[example]]; values are "@tensor_data/<name>" or "@misc/<path>"."""

    name: str | None
    description: str | None
    inputs: dict[str, str] = field(hash=False)
    sample_out: dict[str, str] = field(hash=False)


@dataclass(frozen=True)
class RunnerInfo:
    """The [runner] table."""

    runner_name: str
    required_framework_version: str
    runner_compat_version: int | None = None
    opts: dict[str, str | int | float | bool] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class CartonConfig:
    """A parsed carton.toml."""

    spec_version: int
    model_name: str | None
    short_description: str | None
    model_description: str | None
    license: str | None
    repository: str | None
    homepage: str | None
    required_platforms: tuple[str, ...]
    inputs: tuple[TensorSpec, ...] | None
    outputs: tuple[TensorSpec, ...] | None
    self_tests: tuple[SelfTest, ...]
    examples: tuple[Example, ...]
    runner: RunnerInfo

    def tensor_references(self) -> set[str]:
        """Names of the tensor_data tensors that self tests and examples use."""
        return {ref[len(TENSOR_PREFIX) :] for _, ref in _references(self) if _is_tensor_ref(ref)}

    def misc_references(self) -> set[str]:
        """Carton paths ("misc/x.png") of the misc files that examples use.

        References inside model_description's markdown are not included: they
        are prose, and Carton's own test carton mentions a file it lacks there.
        """
        return {_misc_path(ref) for _, ref in _references(self) if not _is_tensor_ref(ref)}


def parse_carton_toml(raw: bytes) -> CartonConfig:
    """Parse and validate carton.toml bytes.

    Raises InvalidCarton("carton.toml", problem, field=...) for the first
    field that breaks the v1 spec: wrong TOML type, spec_version missing or
    not 1, [runner] or its required keys missing, an unknown dtype, a bad
    shape, duplicate or empty tensor names, self tests or examples without
    declared inputs (or referring to tensors not declared),
    references to undeclared tensors or in the wrong form, a
    short_description over 100 characters.
    """
    top = TomlTable(load_toml(raw, CARTON_TOML), CARTON_TOML)
    spec_version = _spec_version(top)
    inputs = _tensor_specs(top, "input")
    # Inputs without outputs (or the reverse) are accepted, as Carton's own
    # loader accepts them (both are optional there): the absent side is None.
    outputs = _tensor_specs(top, "output")
    return CartonConfig(
        spec_version=spec_version,
        model_name=top.opt_str("model_name"),
        short_description=_short_description(top),
        model_description=top.opt_str("model_description"),
        license=top.opt_str("license"),
        repository=top.opt_str("repository"),
        homepage=top.opt_str("homepage"),
        required_platforms=_required_platforms(top),
        inputs=inputs,
        outputs=outputs,
        self_tests=_self_tests(top, inputs, outputs),
        examples=_examples(top, inputs, outputs),
        runner=_runner(top.req_table("runner")),
    )


def _spec_version(top: TomlTable) -> int:
    version = top.req_int("spec_version")
    if version != SPEC_VERSION:
        raise top.error(
            "spec_version", f"unsupported spec_version {version}; this cartonstore reads version 1"
        )
    return version


def _short_description(top: TomlTable) -> str | None:
    text = top.opt_str("short_description")
    if text is not None and len(text) > SHORT_DESCRIPTION_MAX:
        raise top.error(
            "short_description",
            f"is {len(text)} characters long; the limit is {SHORT_DESCRIPTION_MAX}",
        )
    return text


def _required_platforms(top: TomlTable) -> tuple[str, ...]:
    platforms = top.opt_str_list("required_platforms") or []
    for i, triple in enumerate(platforms):
        if not _TARGET_TRIPLE.fullmatch(triple):
            raise InvalidCarton(
                CARTON_TOML,
                f"{triple!r} is not a target triple like 'x86_64-unknown-linux-gnu'",
                field=f"required_platforms[{i}]",
            )
    return tuple(platforms)


# -- inputs and outputs ------------------------------------------------------


def _tensor_specs(top: TomlTable, key: str) -> tuple[TensorSpec, ...] | None:
    tables = top.opt_tables(key)
    if tables is None:
        return None
    specs = tuple(_tensor_spec(table) for table in tables)
    seen: set[str] = set()
    for table, spec in zip(tables, specs, strict=True):
        if spec.name in seen:
            raise table.error("name", f"{spec.name!r} is used by another {key}")
        seen.add(spec.name)
    return specs


def _tensor_spec(table: TomlTable) -> TensorSpec:
    name = table.req_str("name", non_empty=True)
    dtype = table.req_str("dtype")
    if dtype not in CARTON_DTYPES:
        raise table.error("dtype", f"{dtype!r} is not a carton dtype ({', '.join(CARTON_DTYPES)})")
    return TensorSpec(
        name=name,
        dtype=dtype,
        shape=_shape(table),
        description=table.opt_str("description"),
        internal_name=table.opt_str("internal_name"),
    )


def _shape(table: TomlTable) -> Shape:
    if "shape" not in table.data:
        return None
    shape = table.data["shape"]
    if isinstance(shape, str):
        if not shape:
            raise table.error("shape", "must be a symbol, '*' or a list, not an empty string")
        return shape
    if not isinstance(shape, list):
        raise table.error("shape", f"must be a symbol, '*' or a list, not {type_name(shape)}")
    return tuple(_dimension(table, i, dim) for i, dim in enumerate(shape))


def _dimension(table: TomlTable, index: int, dim: Any) -> int | str:
    where = f"{table.field('shape')}[{index}]"
    if is_int(dim):
        if dim < 0:
            raise InvalidCarton(CARTON_TOML, f"must not be negative, not {dim}", field=where)
        return dim
    if isinstance(dim, str) and dim:
        return dim
    what = "an empty string" if dim == "" else type_name(dim)
    raise InvalidCarton(
        CARTON_TOML, f"must be a non-negative integer, a symbol or '*', not {what}", field=where
    )


# -- self tests and examples -------------------------------------------------


def _self_tests(
    top: TomlTable, inputs: tuple[TensorSpec, ...] | None, outputs: tuple[TensorSpec, ...] | None
) -> tuple[SelfTest, ...]:
    tables = top.opt_tables("self_test") or []
    _require_declared(top, "self_test", tables, inputs, outputs)
    return tuple(
        SelfTest(
            name=table.opt_str("name"),
            description=table.opt_str("description"),
            inputs=_refs(table.req_table("inputs"), inputs or (), "input", misc=False),
            expected_out=_opt_refs(table, "expected_out", outputs or (), misc=False),
        )
        for table in tables
    )


def _examples(
    top: TomlTable, inputs: tuple[TensorSpec, ...] | None, outputs: tuple[TensorSpec, ...] | None
) -> tuple[Example, ...]:
    tables = top.opt_tables("example") or []
    _require_declared(top, "example", tables, inputs, outputs)
    return tuple(
        Example(
            name=table.opt_str("name"),
            description=table.opt_str("description"),
            inputs=_refs(table.req_table("inputs"), inputs or (), "input", misc=True),
            sample_out=_refs(table.req_table("sample_out"), outputs or (), "output", misc=True),
        )
        for table in tables
    )


def _require_declared(
    top: TomlTable, key: str, tables: list[TomlTable], inputs: tuple[TensorSpec, ...] | None,
    outputs: tuple[TensorSpec, ...] | None,
) -> None:
    # A reference to an output when none are declared is caught by _refs.
    if tables and inputs is None:
        also = " and [[output]]" if outputs is None else ""
        raise top.error(key, f"[[{key}]] needs [[input]]{also} to be declared")


def _opt_refs(
    table: TomlTable, key: str, declared: tuple[TensorSpec, ...], *, misc: bool
) -> dict[str, str] | None:
    refs = table.opt_table(key)
    return None if refs is None else _refs(refs, declared, "output", misc=misc)


def _refs(
    refs: TomlTable, declared: tuple[TensorSpec, ...], kind: str, *, misc: bool
) -> dict[str, str]:
    names = [spec.name for spec in declared]
    for name, ref in refs.data.items():
        if name not in names:
            declared_names = ", ".join(names) or "none"
            raise refs.error(name, f"{name!r} is not a declared {kind} ({declared_names})")
        _check_ref(refs, name, ref, misc=misc)
    return dict(refs.data)


def _check_ref(refs: TomlTable, name: str, ref: Any, *, misc: bool) -> None:
    allowed = "'@tensor_data/<name>' or '@misc/<path>'" if misc else "'@tensor_data/<name>'"
    if not isinstance(ref, str):
        raise refs.error(name, f"must be a string like {allowed}, not {type_name(ref)}")
    if ref.startswith(TENSOR_PREFIX) and len(ref) > len(TENSOR_PREFIX):
        return
    if misc and ref.startswith(MISC_PREFIX):
        validate_carton_path(_misc_path(ref), file_for_errors=CARTON_TOML, field=refs.field(name))
        return
    hint = " (self tests can only use tensor_data)" if ref.startswith(MISC_PREFIX) else ""
    raise refs.error(name, f"must be a reference like {allowed}, not {ref!r}{hint}")


def _is_tensor_ref(ref: str) -> bool:
    return ref.startswith(TENSOR_PREFIX)


def _misc_path(ref: str) -> str:
    return "misc/" + ref[len(MISC_PREFIX) :]


def _references(config: CartonConfig) -> Iterator[tuple[str, str]]:
    """(field, reference) for every reference in self tests and examples."""
    for i, test in enumerate(config.self_tests):
        yield from _named(f"self_test[{i}].inputs", test.inputs)
        yield from _named(f"self_test[{i}].expected_out", test.expected_out or {})
    for i, example in enumerate(config.examples):
        yield from _named(f"example[{i}].inputs", example.inputs)
        yield from _named(f"example[{i}].sample_out", example.sample_out)


def _named(prefix: str, refs: dict[str, str]) -> Iterator[tuple[str, str]]:
    for name, ref in refs.items():
        yield join_field(prefix, name), ref


def check_references(
    config: CartonConfig, manifest_paths: Collection[str], tensor_names: Collection[str]
) -> None:
    """Check that every reference in ``config`` points at something that exists.

    ``tensor_names`` are the names tensor_data/index.toml defines (empty when
    the carton has none) and ``manifest_paths`` the paths the MANIFEST lists.
    Raises InvalidCarton("carton.toml", ..., field="self_test[0].inputs.x")
    for the first reference to a missing tensor or misc file.
    """
    for where, ref in _references(config):
        if _is_tensor_ref(ref):
            name = ref[len(TENSOR_PREFIX) :]
            if name not in tensor_names:
                raise InvalidCarton(
                    CARTON_TOML,
                    f"refers to tensor {name!r}, which tensor_data/index.toml does not define",
                    field=where,
                )
        elif _misc_path(ref) not in manifest_paths:
            problem = f"refers to {_misc_path(ref)}, which the MANIFEST does not list"
            raise InvalidCarton(CARTON_TOML, problem, field=where)


# -- runner ------------------------------------------------------------------


def _runner(runner: TomlTable) -> RunnerInfo:
    runner_name = runner.req_str("runner_name", non_empty=True)
    version_req = runner.req_str("required_framework_version")
    if not all(_VERSION_REQ.fullmatch(part.strip()) for part in version_req.split(",")):
        raise runner.error(
            "required_framework_version",
            f"{version_req!r} is not a semver version requirement like '=1.12.1' or '>=2, <3'",
        )
    return RunnerInfo(
        runner_name=runner_name,
        required_framework_version=version_req,
        runner_compat_version=runner.opt_int("runner_compat_version", minimum=0),
        opts=_runner_opts(runner.opt_table("opts")),
    )


def _runner_opts(opts: TomlTable | None) -> dict[str, str | int | float | bool]:
    # Carton's RunnerOpt is an integer, a double, a string or a boolean.
    if opts is None:
        return {}
    for key, value in opts.data.items():
        if not isinstance(value, (str, int, float)):  # bool is an int
            raise opts.error(
                key, f"must be a string, integer, float or boolean, not {type_name(value)}"
            )
    return dict(opts.data)
