"""unilab_gym.validation: one answer for int / positive / real arguments everywhere."""

import math
import re

import numpy as np
import pytest

from unilab_gym.validation import (
    REAL_DTYPE_KINDS,
    check_action_array,
    check_int,
    check_positive,
    check_positive_int,
    check_real,
    check_real_array,
    check_seed,
)


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_check_int_accepts_python_and_numpy_ints_as_int(value):
    out = check_int("n", value)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 3.0, "3", None, np.float64(3.0)])
def test_check_int_refuses_bool_float_and_other_types(value):
    with pytest.raises(ValueError, match=r"^n must be an int, got ") as info:
        check_int("n", value)
    assert repr(value) in str(info.value)


def test_check_int_bounds_are_inclusive_and_named_in_the_message():
    assert check_int("k", 0, minimum=0, maximum=5) == 0
    assert check_int("k", 5, minimum=0, maximum=5) == 5
    with pytest.raises(ValueError, match=r"k must be an int in \[0, 5\], got 6"):
        check_int("k", 6, minimum=0, maximum=5)
    with pytest.raises(ValueError, match=re.escape(f"k must be an int >= 2, got {np.int64(1)!r}")):
        check_int("k", np.int64(1), minimum=2)
    with pytest.raises(ValueError, match=r"k must be an int <= 5, got 7"):
        check_int("k", 7, maximum=5)


def test_check_positive_int():
    assert check_positive_int("batch_size", np.int64(1)) == 1
    for bad in (0, -3, True, 1.5):
        with pytest.raises(ValueError, match=rf"batch_size must be an int >= 1 \(a positive int\), got {bad!r}"):
            check_positive_int("batch_size", bad)


@pytest.mark.parametrize("value", [2, 2.5, np.float32(2.5), np.int64(2), np.float64(2.5)])
def test_check_real_accepts_finite_numbers_as_float(value):
    out = check_real("x", value)
    assert out == float(value) and type(out) is float


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float64("nan"), True, np.bool_(False), "1", None])
def test_check_real_refuses_nan_inf_bool_and_non_numbers(value):
    with pytest.raises(ValueError, match=r"^x must be a finite number, got ") as info:
        check_real("x", value)
    assert repr(value) in str(info.value)


def test_check_real_bounds():
    assert check_real("p", 0.0, minimum=0.0, maximum=1.0) == 0.0
    assert check_real("p", 1, minimum=0.0, maximum=1.0) == 1.0
    with pytest.raises(ValueError, match=r"p must be a finite number >= 0.0 and <= 1.0, got 1.5"):
        check_real("p", 1.5, minimum=0.0, maximum=1.0)
    with pytest.raises(ValueError, match=r"p must be a finite number > 0.0, got 0.0"):
        check_real("p", 0.0, minimum=0.0, exclusive_minimum=True)
    with pytest.raises(ValueError, match=r"dt must be a finite number > 0.0, got -1"):
        check_positive("dt", -1)
    assert check_positive("dt", np.float32(0.5)) == 0.5


def test_check_real_array_keeps_arrays_and_refuses_other_dtypes():
    arr = np.zeros(3, np.float32)
    assert check_real_array("obs", arr) is arr
    np.testing.assert_array_equal(check_real_array("obs", [1, 2]), [1, 2])
    for kind in "biuf":
        assert kind in REAL_DTYPE_KINDS
    for bad in (np.array(["a"]), np.array([1j]), np.array([None], dtype=object)):
        with pytest.raises(ValueError, match=rf"obs must hold real numbers .*, got dtype {bad.dtype}"):
            check_real_array("obs", bad)


@pytest.mark.parametrize("bad", [-1, 1.5, True, 2**63, "3", None])
def test_check_seed_refuses_what_numpy_and_gymnasium_refuse(bad):
    with pytest.raises(ValueError, match=r"seed must be an int >= 0"):
        check_seed("seed", bad)


def test_check_seed_accepts_numpy_ints():
    assert check_seed("seed", np.uint64(2**63 - 1)) == 2**63 - 1 and type(check_seed("seed", np.int32(4))) is int


def test_huge_ints_and_ragged_arrays_get_named_value_errors():
    with pytest.raises(ValueError, match="dt must be a finite number"):
        check_real("dt", 10**400)
    with pytest.raises(ValueError, match="arr must be an array of real numbers"):
        check_real_array("arr", [[1, 2], [3]])


def test_check_action_array_type_errors_for_wrong_types_value_errors_for_wrong_shapes():
    out = check_action_array("action", np.ones((2, 3), np.float32), (2, 3))
    assert out.dtype == np.float64 and out.shape == (2, 3)
    src = np.zeros((2, 3))
    assert check_action_array("action", src, (2, 3)) is not src  # a new array: the caller may write it
    np.testing.assert_array_equal(
        check_action_array("action", [[1, 0, 1], [True, False, True]], (2, 3)), [[1, 0, 1]] * 2
    )
    for bad in (0.5, np.float64(0.5), "0.5", b"1", None, [["0.5"] * 3] * 2, np.zeros((2, 3), complex), [[1j] * 3] * 2):
        with pytest.raises(TypeError, match="action must"):
            check_action_array("action", bad, (2, 3))
    for bad in (np.zeros((3, 2)), np.zeros(3), [[0.0] * 3, [0.0] * 2]):
        with pytest.raises(ValueError, match=r"action must .*\(2, 3\)"):
            check_action_array("action", bad, (2, 3))
