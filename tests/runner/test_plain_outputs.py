"""A model's plain list or Python number as an output (runner/model_call.py):
it takes the declared dtype only when its values are of that kind and fit
it; otherwise it stays as numpy reads it, for output_problem to refuse by
name at every infer (tests/server/test_model_checks.py, end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from cartonstore.format.carton_toml import TensorSpec
from cartonstore.runner.declared import output_problem
from cartonstore.runner.model_call import _plain_array


def _spec(dtype: str) -> TensorSpec:
    return TensorSpec("y", dtype, "*")


@pytest.mark.parametrize(("value", "dtype", "expected"), [
    ([1, 2], "int32", np.int32),
    ([1, 2], "float32", np.float32),          # ints that a float32 holds exactly
    ([0.1, 2.5], "float32", np.float32),      # doubles rounded to float32, as a float32 output is
    ([1.5, -2.0], "float64", np.float64),
    (7, "int64", np.int64),
])
def test_values_that_fit_take_the_declared_dtype(value: object, dtype: str, expected: type) -> None:
    array = _plain_array(value, _spec(dtype))
    assert array.dtype == expected and output_problem("y", array, {"y": _spec(dtype)}) is None


@pytest.mark.parametrize(("value", "dtype", "named"), [
    ([0.7, 1.9], "int32", "float64"),         # never cut to an integer
    ([2 ** 40, 1], "int32", "int64"),         # never wrapped
    ([2 ** 25 + 1], "float32", "int64"),      # an int that float32 cannot hold exactly
    ([1e300, 1.0], "float32", "float64"),     # never overflowed to infinity
    ([float("nan"), 1e20], "int64", "float64"),   # not cast at all (a NaN cast to int warned, an error under -W error)
])
def test_values_that_do_not_fit_stay_as_they_are_and_are_refused(value: object, dtype: str, named: str) -> None:
    array = _plain_array(value, _spec(dtype))
    problem = output_problem("y", array, {"y": _spec(dtype)})
    assert array.dtype.name == named and problem is not None and f"is {named}" in problem, problem
