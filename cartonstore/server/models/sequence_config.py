"""A load's ``sequence_batching`` read as Triton's model configuration
gives it (load_params.py: protobuf's ModelConfig as JSON, so an enum left
at its default, CONTROL_SEQUENCE_START, is absent): the direct strategy,
``max_sequence_idle_microseconds`` and the control inputs the daemon fills
in each request of a sequence. Everything else (the oldest strategy,
implicit state, iterative sequences, the direct strategy's queue delay) is
refused by name rather than accepted and ignored. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cartonstore.errors import InvalidInput
from cartonstore.format.carton_toml import TensorSpec
from cartonstore.format.dtypes import carton_dtype_to_v2

START, READY, END, CORRID = "CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END", \
    "CONTROL_SEQUENCE_CORRID"
KINDS = (START, READY, END, CORRID)
DEFAULT_IDLE_US = 1_000_000          # Triton's: a sequence idle this long frees its slot
MAX_IDLE_US = 24 * 3600 * 1_000_000  # a day: longer is a mistake, not a policy
_FLAG_FIELDS = {"int32_false_true": "INT32", "fp32_false_true": "FP32", "bool_false_true": "BOOL"}
_CORRID_TYPES = {"TYPE_UINT64": "UINT64", "TYPE_INT64": "INT64", "TYPE_UINT32": "UINT32", "TYPE_INT32": "INT32",
                 "TYPE_STRING": "BYTES"}
_FIELDS = ("max_sequence_idle_microseconds", "control_input", "direct")
_NOT_WITH = ("dynamic_batching", "response_cache")


@dataclass(frozen=True)
class Control:
    """One control input: the tensor ``name`` of ``datatype`` the daemon
    adds to each request, ``false``/``true`` its values for a flag kind."""

    name: str
    kind: str
    datatype: str
    false: Any = None
    true: Any = None


@dataclass(frozen=True)
class SequencePolicy:
    idle_us: int
    controls: tuple[Control, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(c.name for c in self.controls)

    @property
    def corrid_type(self) -> str | None:
        """The CORRID control's datatype (BYTES: a string id), None without one."""
        return next((c.datatype for c in self.controls if c.kind == CORRID), None)

    def as_config(self) -> dict[str, Any]:
        controls = []
        for c in self.controls:
            entry: dict[str, Any] = {"kind": c.kind}
            if c.kind == CORRID:
                entry["data_type"] = next(k for k, v in _CORRID_TYPES.items() if v == c.datatype)
            else:
                field = next(k for k, v in _FLAG_FIELDS.items() if v == c.datatype)
                entry[field] = [c.false, c.true]
            controls.append({"name": c.name, "control": [entry]})
        return {"max_sequence_idle_microseconds": self.idle_us, "control_input": controls, "direct": {}}


def _refuse(message: str, subject: str) -> InvalidInput:
    return InvalidInput(f"config: sequence_batching: {message}", subject=subject)


def sequence_policy(config: Mapping[str, Any] | None, inputs: Sequence[TensorSpec] | None) -> SequencePolicy | None:
    """The load's sequence_batching checked (InvalidInput naming what is
    wrong), or None when it asks for none. ``inputs``: the carton's
    declared inputs, which a control input may be (an ONNX graph's START
    is one) when its datatype agrees."""
    given = (config or {}).get("sequence_batching")
    if given is None:
        return None
    for other in _NOT_WITH:
        if other in (config or {}):
            raise _refuse(f"cartonstore does not serve a sequence model with {other!r} (a sequence's requests "
                          f"depend on the state its earlier ones left)", other)
    for key, value in given.items():
        if key not in _FIELDS:
            raise _refuse(f"cartonstore does not support {key!r} = {value!r} (it serves the direct strategy: "
                          f"{', '.join(_FIELDS)})", key)
    for key, value in (given.get("direct") or {}).items():
        raise _refuse(f"direct: cartonstore does not support {key!r} = {value!r} (each request of a sequence "
                      f"goes to its instance as it comes)", key)
    idle = int(given.get("max_sequence_idle_microseconds") or DEFAULT_IDLE_US)
    if not 0 < idle <= MAX_IDLE_US:
        raise _refuse(f"'max_sequence_idle_microseconds' must be in [1, {MAX_IDLE_US}], not {idle}",
                      "max_sequence_idle_microseconds")
    declared = {spec.name: spec for spec in inputs or ()}
    controls: list[Control] = []
    for entry in given.get("control_input", ()):
        control = _control(entry)
        if control.name in {c.name for c in controls}:
            raise _refuse(f"control input {control.name!r} is given twice", control.name)
        if control.kind in {c.kind for c in controls}:
            raise _refuse(f"two control inputs are {control.kind}", control.name)
        spec = declared.get(control.name)
        if spec is not None and carton_dtype_to_v2(spec.dtype) != control.datatype:
            raise _refuse(f"control input {control.name!r} is {control.datatype}, but the carton declares it "
                          f"{carton_dtype_to_v2(spec.dtype)}", control.name)
        controls.append(control)
    return SequencePolicy(idle, tuple(controls))


def _control(entry: Mapping[str, Any]) -> Control:
    name = entry.get("name") or ""
    for key in entry:
        if key not in ("name", "control"):
            raise _refuse(f"control input {name!r}: cartonstore does not support {key!r}", key)
    if not name:
        raise _refuse("a control input needs a 'name'", "control_input")
    kinds = entry.get("control") or []
    if len(kinds) != 1:
        raise _refuse(f"control input {name!r} needs exactly one 'control', not {len(kinds)}", name)
    control = kinds[0]
    kind = control.get("kind", START)
    if kind not in KINDS:
        raise _refuse(f"control input {name!r}: kind {kind!r} is not supported (it serves {', '.join(KINDS)})", name)
    fields = [k for k in control if k != "kind"]
    if kind == CORRID:
        data_type = control.get("data_type", "")
        if fields != ["data_type"] or data_type not in _CORRID_TYPES:
            raise _refuse(f"control input {name!r} ({kind}) needs 'data_type', one of "
                          f"{', '.join(_CORRID_TYPES)} (got {dict(control)!r})", name)
        return Control(name, kind, _CORRID_TYPES[data_type])
    if len(fields) != 1 or fields[0] not in _FLAG_FIELDS:
        raise _refuse(f"control input {name!r} ({kind}) needs one of {', '.join(_FLAG_FIELDS)} "
                      f"(got {dict(control)!r})", name)
    values = control[fields[0]]
    if len(values) != 2:
        raise _refuse(f"control input {name!r}: {fields[0]} holds the [false, true] values, not {values!r}", name)
    return Control(name, kind, _FLAG_FIELDS[fields[0]], values[0], values[1])
