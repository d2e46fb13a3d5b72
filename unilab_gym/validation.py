"""Argument checks shared by every public boundary of the package.

One answer everywhere: an integer argument accepts Python ``int`` and numpy integers
(``np.int64(3)``), never ``bool``; a real argument accepts any finite real number (``int``,
``float``, numpy scalars), never ``bool``. Each check returns the value converted to a plain
Python ``int`` / ``float`` and raises ``ValueError`` naming the argument and the offending
value, so callers validate at the boundary and keep no state from a bad call.
"""

from __future__ import annotations

import ipaddress
import math
import numbers
import socket
from typing import Any

import numpy as np

#: numpy dtype kinds that hold real numbers: bool, signed and unsigned int, float.
REAL_DTYPE_KINDS = frozenset("biuf")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int``, if it is an integer within ``[minimum, maximum]`` (either bound optional).

    Raises:
        ValueError: ``value`` is not an ``int`` / numpy integer (``bool`` is refused), or is out of range.
    """
    if not _is_int(value):
        raise ValueError(f"{name} must be an int{_bounds(minimum, maximum)}, got {value!r}")
    out = int(value)
    if (minimum is not None and out < minimum) or (maximum is not None and out > maximum):
        raise ValueError(f"{name} must be an int{_bounds(minimum, maximum)}, got {value!r}")
    return out


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as an ``int`` >= 1 (see :func:`check_int`).

    Raises:
        ValueError: not an integer, or < 1.
    """
    return check_int(name, value, minimum=1)


def check_real(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
) -> float:
    """``value`` as a finite ``float`` within ``[minimum, maximum]`` (``(minimum, maximum]`` if ``exclusive_minimum``).

    Raises:
        ValueError: not a real number (``bool`` is refused), NaN or infinite, or out of range.
    """
    try:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    except OverflowError:  # an int too large for a float, e.g. 10**400
        ok = False
    if ok:
        out = float(value)
        if minimum is not None and (out <= minimum if exclusive_minimum else out < minimum):
            ok = False
        if maximum is not None and out > maximum:
            ok = False
    if not ok:
        low = "" if minimum is None else (f" > {minimum}" if exclusive_minimum else f" >= {minimum}")
        high = "" if maximum is None else f" <= {maximum}"
        joined = " and".join(part for part in (low, high) if part)
        raise ValueError(f"{name} must be a finite number{joined}, got {value!r}")
    return out


def check_seed(name: str, value: Any) -> int:
    """``value`` as a seed: an ``int`` in ``[0, 2**63)`` (numpy integers accepted, ``bool`` refused).

    Non-negative because numpy's ``SeedSequence`` and Gymnasium's ``np_random`` refuse negative seeds.

    Raises:
        ValueError: not an integer, negative, or ``>= 2**63``.
    """
    if not _is_int(value) or not 0 <= int(value) < 2**63:
        raise ValueError(f"{name} must be an int >= 0 (and < 2**63), got {value!r}")
    return int(value)


def check_positive(name: str, value: Any) -> float:
    """``value`` as a finite ``float`` > 0 (see :func:`check_real`).

    Raises:
        ValueError: not a finite real number, or <= 0.
    """
    return check_real(name, value, minimum=0.0, exclusive_minimum=True)


def check_host(name: str, value: Any) -> str:
    """``value`` as an address a server can bind: an IPv4 or IPv6 address, or a host name that resolves.

    A value made only of digits and dots (``"256.1.1.1"``, ``"127.1"``) must be a valid dotted-quad
    IPv4 address; it is never looked up as a host name. A host name is resolved with
    ``socket.getaddrinfo`` (the local resolver: ``/etc/hosts``, then DNS).

    Raises:
        ValueError: not a non-empty ``str``, an invalid IP address, or a host name that does not resolve.
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a host name or IP address (a non-empty str), got {value!r}")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if ":" in value or all(ch.isdigit() or ch == "." for ch in value):
        raise ValueError(f"{name} must be a host name or IP address, got {value!r}: not a valid IPv4 or IPv6 address")
    try:
        socket.getaddrinfo(value, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:  # socket.gaierror is an OSError
        raise ValueError(
            f"{name} must be a host name or IP address, got {value!r}, which does not resolve ({error})"
        ) from None
    return value


def check_real_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a numpy array of real numbers (dtype kind in :data:`REAL_DTYPE_KINDS`), not copied if it is one.

    Raises:
        ValueError: the array's dtype is not bool, int or float (e.g. object, complex, str).
    """
    try:
        arr = value if type(value) is np.ndarray else np.asarray(value)
    except (TypeError, ValueError) as error:  # ragged nested lists, objects numpy cannot convert
        raise ValueError(f"{name} must be an array of real numbers, got {value!r} ({error})") from None
    if arr.dtype.kind not in REAL_DTYPE_KINDS:
        raise ValueError(f"{name} must hold real numbers (bool, int or float), got dtype {arr.dtype}")
    return arr


def check_action_array(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as a new float64 array of ``shape``: the boundary check of ``step()`` actions.

    Types as Python and Gymnasium expect: a value of the wrong *type* (a scalar, a string, complex numbers,
    objects) raises ``TypeError``; a real array of the wrong *shape* raises ``ValueError``. Values are not
    checked (NaN / inf are the caller's to name).

    Raises:
        TypeError: ``value`` is a scalar (0-d), or its dtype is not bool, int or float (e.g. str, complex, object).
        ValueError: ``value`` is ragged or its shape is not ``shape``.
    """
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be an array of real numbers of shape {shape}, got a string {value!r}")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as error:  # ragged nested lists
        raise ValueError(f"{name} must be an array of real numbers of shape {shape}, got {value!r} ({error})") from None
    if arr.ndim == 0:
        raise TypeError(
            f"{name} must be an array of real numbers of shape {shape}, got a scalar {value!r} ({type(value).__name__})"
        )
    if arr.dtype.kind not in REAL_DTYPE_KINDS:
        raise TypeError(f"{name} must hold real numbers (bool, int or float), got dtype {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    return np.array(arr, dtype=np.float64)


def _bounds(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return " >= 1 (a positive int)" if minimum == 1 else f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""
