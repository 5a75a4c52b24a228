"""A carton's own self-tests ([[self_test]] in carton.toml), run through
the model's runner: inputs come from tensor_data/, outputs are compared with
expected_out (numbers with numpy's allclose, strings exactly).

The daemon runs them on load (runners.selftest_on_load) and on
POST /v2/models/{name}/selftest; `cartonstore selftest` runs them through
the daemon, or through a runner of its own when no daemon serves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cartonstore.errors import CartonStoreError, InvalidInput
from cartonstore.format.carton_toml import TENSOR_PREFIX, CartonConfig
from cartonstore.format.tensor_data import INDEX, load_tensors, parse_tensor_index
from cartonstore.runner.protocol import infer_path
from cartonstore.v2.error_body import error_text
from cartonstore.v2.framing import HEADER_LENGTH, encode_infer_request, parse_infer_request, parse_infer_response
from cartonstore.v2.validate import validate_request


class RunnerAnswer(Protocol):
    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def body(self) -> bytes | bytearray | memoryview: ...


class Runners(Protocol):
    """What self-tests send requests to: the daemon's ModelRunners (server/runner_processes)."""

    name: str

    async def forward(self, path: str, body: list[bytes | memoryview], headers: Mapping[str, str]) -> RunnerAnswer: ...

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8
Infer = Callable[[Mapping[str, np.ndarray]], Awaitable[Mapping[str, np.ndarray]]]


@dataclass
class SelfTestCase:
    name: str
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]    # empty: the test passes when the model answers
    invalid: str | None = None         # why the test cannot be sent at all (then inputs are empty)


PASSED, FAILED, INVALID = "passed", "failed", "invalid"


@dataclass
class TestResult:
    """One test's outcome: passed; failed (the model answered wrong, or
    with an error); or invalid (the test itself is broken: its tensors do
    not fit the model's declared inputs, so no request was sent; that says
    nothing of the model)."""

    name: str
    outcome: str
    error: str | None = None           # failed or invalid: why
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.outcome == PASSED

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "passed": self.passed, "outcome": self.outcome,
                               "seconds": round(self.seconds, 6)}
        if self.error is not None:
            out["error"] = self.error
        if self.mismatches:
            out["mismatches"] = self.mismatches
        return out

    def line(self) -> str:
        if self.passed:
            return f"PASS {self.name} ({self.seconds * 1e3:.1f} ms)"
        label = "INVALID" if self.outcome == INVALID else "FAIL"
        if self.error is not None:
            return f"{label} {self.name}: {self.error}"
        return f"{label} {self.name}: " + "; ".join(m["problem"] for m in self.mismatches)


@dataclass
class SelfTestReport:
    tests: list[TestResult]
    rtol: float
    atol: float

    @property
    def passed(self) -> bool:
        return all(t.passed for t in self.tests)

    @property
    def model_failed(self) -> bool:
        """Whether the model failed a test it was sent (what stops a load;
        an invalid test does not)."""
        return any(t.outcome == FAILED for t in self.tests)

    def summary(self) -> str:
        if not self.tests:
            return "no self-tests: the carton declares none"
        failed = [t for t in self.tests if t.outcome == FAILED]
        invalid = [t for t in self.tests if t.outcome == INVALID]
        if not failed and not invalid:
            return f"{len(self.tests)} self-test(s) passed"
        parts = []
        if failed:
            parts.append(f"{len(failed)} of {len(self.tests)} self-test(s) failed: "
                         + " | ".join(t.line().split(" ", 1)[1] for t in failed))
        if invalid:
            parts.append(f"{len(invalid)} of {len(self.tests)} self-test(s) could not be sent (the test is "
                         f"broken, not the model): " + " | ".join(t.line().split(" ", 1)[1] for t in invalid))
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "model_failed": self.model_failed, "summary": self.summary(),
                "rtol": self.rtol, "atol": self.atol, "tests": [t.as_json() for t in self.tests]}


def self_test_cases(carton: CartonConfig, model_dir: Path) -> list[SelfTestCase]:
    """Every [[self_test]] with its tensors read from ``model_dir``'s
    tensor_data/. A test naming a nested tensor cannot be sent over v2: it
    comes back invalid."""
    if not carton.self_tests:
        return []
    entries = parse_tensor_index((model_dir / INDEX).read_bytes())
    # Only what the self-tests name is read: examples' tensors may be big, and are not sent.
    wanted = {ref[len(TENSOR_PREFIX):] for test in carton.self_tests
              for ref in (*test.inputs.values(), *(test.expected_out or {}).values())}
    wanted |= {name for e in entries if e.name in wanted and e.inner for name in e.inner}
    tensors = load_tensors([e for e in entries if e.name in wanted], lambda path: (model_dir / path).read_bytes())
    cases = []
    for index, test in enumerate(carton.self_tests):
        name = test.name or f"self_test[{index}]"
        try:
            cases.append(SelfTestCase(name, _arrays(tensors, test.inputs, name),
                                      _arrays(tensors, test.expected_out or {}, name)))
        except InvalidInput as e:
            cases.append(SelfTestCase(name, {}, {}, e.message))
    return cases


def _arrays(tensors: Mapping[str, Any], refs: Mapping[str, str], test: str) -> dict[str, np.ndarray]:
    out = {}
    for key, ref in refs.items():
        value = tensors.get(ref[len(TENSOR_PREFIX):])
        if not isinstance(value, np.ndarray):
            raise InvalidInput(f"self-test {test!r}: {key} = {ref!r} is a nested tensor, which KServe v2 "
                               f"cannot carry", subject=test)
        out[key] = value
    return out


def compare(expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], rtol: float,
            atol: float) -> list[dict[str, Any]]:
    """One entry per output that differs: its name, shapes, the largest
    difference and where it is."""
    out = []
    for name, want in expected.items():
        have = got.get(name)
        info: dict[str, Any] = {"output": name, "expected_shape": list(want.shape)}
        if have is None:
            out.append({**info, "problem": f"output {name!r} is missing from the answer"})
            continue
        info["shape"] = list(have.shape)
        if have.shape != want.shape:
            out.append({**info, "problem": f"output {name!r} has shape {list(have.shape)}, "
                                           f"expected {list(want.shape)}"})
        elif want.dtype == object or have.dtype == object:
            problem = _string_problem(name, want, have)
            if problem:
                out.append({**info, **problem})
        else:
            problem = _numeric_problem(name, want, have, rtol, atol)
            if problem:
                out.append({**info, **problem})
    return out


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _string_problem(name: str, want: np.ndarray, have: np.ndarray) -> dict[str, Any] | None:
    flat_want, flat_have = want.reshape(-1), have.reshape(-1)
    for i in range(flat_want.size):
        if _text(flat_want[i]) != _text(flat_have[i]):
            where = [int(k) for k in np.unravel_index(i, want.shape)]
            return {"index": where, "problem": f"output {name!r} differs at {where}: "
                                               f"{_text(flat_have[i])[:60]!r}, expected {_text(flat_want[i])[:60]!r}"}
    return None


def _numeric_problem(name: str, want: np.ndarray, have: np.ndarray, rtol: float,
                     atol: float) -> dict[str, Any] | None:
    if have.dtype != want.dtype:
        return {"problem": f"output {name!r} is {have.dtype}, expected {want.dtype}"}
    if want.dtype.kind in "iub":   # integers and booleans: exactly (float64 would round big ones)
        bad = have != want
    else:                          # NaN matches NaN, inf matches inf of its sign
        bad = ~np.isclose(have, want, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
    diff = np.where(np.isnan(diff), np.inf, diff)   # NaN against a number is as far off as it gets
    flat = int(np.argmax(np.where(bad, diff, -1.0).reshape(-1)))   # the worst element that fails
    where = [int(k) for k in np.unravel_index(flat, want.shape)] if want.shape else []
    largest = float(diff.reshape(-1)[flat])
    rule = "exactly" if want.dtype.kind in "iub" else f"rtol {rtol:g}, atol {atol:g}"
    return {"index": where, "max_abs_diff": largest, "mismatched": int(bad.sum()),
            "problem": f"output {name!r} differs in {int(bad.sum())} element(s), worst by {largest:.6g} at "
                       f"{where} ({have.reshape(-1)[flat]!r} vs expected {want.reshape(-1)[flat]!r}; {rule})"}


async def run_self_tests(cases: list[SelfTestCase], infer: Infer, *, rtol: float = DEFAULT_RTOL,
                         atol: float = DEFAULT_ATOL) -> SelfTestReport:
    """Each case through ``infer``, one after another; a failed request
    fails its test with the error, it does not stop the others. ``infer``
    raises InvalidInput for a request refused before the model saw it
    (the test is invalid), any other CartonStoreError for the model's error."""
    results = []
    for case in cases:
        if case.invalid is not None:
            results.append(TestResult(case.name, INVALID, case.invalid))
            continue
        started = time.perf_counter()
        try:
            got = await infer(case.inputs)
        except InvalidInput as e:
            results.append(TestResult(case.name, INVALID, e.message, seconds=time.perf_counter() - started))
            continue
        except CartonStoreError as e:
            results.append(TestResult(case.name, FAILED, e.message, seconds=time.perf_counter() - started))
            continue
        seconds = time.perf_counter() - started
        mismatches = await asyncio.to_thread(compare, case.expected, got, rtol, atol)
        results.append(TestResult(case.name, FAILED if mismatches else PASSED, None, mismatches, seconds))
    return SelfTestReport(results, rtol, atol)


async def infer_via(runners: Runners, carton: CartonConfig, inputs: Mapping[str, np.ndarray],
                    name: str | None = None) -> dict[str, np.ndarray]:
    """One request to ``runners``, validated against the carton first as
    the daemon validates any request; every output, binary."""
    parts, header_length = encode_infer_request(inputs, binary=True, binary_outputs=True)
    body = b"".join(parts)

    def check() -> None:
        validate_request(parse_infer_request(body, header_length), carton.inputs, carton.outputs)
    await asyncio.to_thread(check)
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers[HEADER_LENGTH] = str(header_length)
    answer = await runners.forward(infer_path(name or runners.name), [body], headers)
    if answer.status != 200:
        raise CartonStoreError(f"the runner answered {answer.status}: {error_text(answer.body)}")
    length = {k.lower(): v for k, v in answer.headers.items()}.get(HEADER_LENGTH.lower())
    return parse_infer_response(answer.body, int(length) if length is not None else None)[1]
