"""Bounded parsing of untrusted Kubernetes values: quantities, strings, fractions.

What a pod or an inventory says is read here before it sizes anything: a Kubernetes quantity
in a stated range (``quantity``), a string of at most a stated length (``bounded_text``),
``gpufrac.io/fraction`` in milli-GPU (``fraction_milli``), each refusing with a
``PodSpecError`` whose message names the field, quotes the value (``quote``) and gives the rule.
"""

from __future__ import annotations

import functools
import json
import re
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

from podspec import annotations as ann
from scoring.request import MILLI_PER_GPU

MIB = 1024 * 1024
"""Bytes in a MiB."""


class PodSpecError(ValueError):
    """A pod's resources or gpufrac annotations are invalid; the message is user-facing."""


def quote(value: object, limit: int = 64) -> str:
    """JSON-quote a user-provided value for messages and logs, truncated to ``limit`` chars."""
    text = str(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return json.dumps(text)


# -- bounds --------------------------------------------------------------------------------
# Every quantity from a pod, node or request body is checked against one of these before it
# becomes a number the core sees, so nothing a user writes can size an array, overflow
# int64 or underflow to zero. Each is far beyond any real machine.

MAX_GPUS_PER_POD = ann.MAX_GPUS_PER_NODE
"""Most GPUs a pod may ask for: the most a node's inventory may list (``NodeInventory.gpus``)."""
MAX_CPU_MILLI = 10**9
"""Largest CPU request or allocatable, milli-cores (a million cores)."""
MAX_MEMORY_MIB = 2**40
"""Largest host memory request or allocatable, MiB (an exbibyte)."""
MAX_GPU_MEMORY_MIB = ann.MAX_GPU_MEMORY_MIB
"""Largest GPU memory per GPU a pod may ask for, MiB (16 TiB)."""
MAX_CORES = Decimal(MAX_CPU_MILLI) / 1000
MAX_MEMORY_BYTES = Decimal(MAX_MEMORY_MIB) * MIB
MAX_GPU_MEMORY_BYTES = Decimal(MAX_GPU_MEMORY_MIB) * MIB
INT32 = (-(2**31), 2**31 - 1)
"""Range of ``spec.priority`` (Go ``*int32``)."""
MAX_NAME_CHARS = 253
MAX_MODELS = 64

_QUANTITY = re.compile(
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3}|[KMGTPE]i|[numkMGTPE])?", re.ASCII)
"""Kubernetes' quantity grammar (``resource.ParseQuantity``), ASCII digits only, exponents of
at most three digits (``1e-1000030`` would underflow to 0 and ``1e999999`` overflow)."""
_FRACTION = re.compile(r"(?:[0-9]{1,4}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})", re.ASCII)


def bounded_text(value: object, field: str, limit: int = MAX_NAME_CHARS) -> str:
    """A string field of user input: must be a string of at most ``limit`` characters."""
    if not isinstance(value, str):
        raise PodSpecError(f"{field}: {quote(value)} must be a string")
    if len(value) > limit:
        raise PodSpecError(f"{field}: {quote(value)} is longer than {limit} characters")
    return value


_NOT_IN_GRAMMAR = 'is not a Kubernetes quantity (e.g. "8Gi", "500Mi", "2")'
QUANTITY_MEMO = 4096
"""Quantity strings whose value ``_value`` keeps (64 characters at most each)."""


@functools.lru_cache(maxsize=QUANTITY_MEMO)
def _value(text: str) -> Decimal | str:
    """The value of ``text`` (at most 64 characters) in Kubernetes' quantity grammar, or why
    it has none. Memoised: the pods of a cluster repeat a few quantities ("100m", "64Mi"),
    and every pod is parsed at each watch event and each verb."""
    if not _QUANTITY.fullmatch(text):
        return _NOT_IN_GRAMMAR
    try:
        return Decimal(parse_quantity(text))
    except (ValueError, TypeError, ArithmeticError):
        return "is not a Kubernetes quantity"


def quantity(value: object, field: str, *, maximum: Decimal | int, unit: str = "",
              positive: bool = False) -> Decimal:
    """A Kubernetes quantity in ``[0, maximum]`` (``(0, maximum]`` with ``positive``).

    Accepts a string in Kubernetes' quantity grammar (ASCII digits, SI or binary suffix) or a
    JSON number written in that grammar; never a boolean, a list or an object.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise PodSpecError(f"{field}: {quote(value)} must be a quantity string, e.g. \"8Gi\", \"500m\", \"2\"")
    text = value.strip() if isinstance(value, str) else repr(value)
    q = _value(text) if len(text) <= 64 else _NOT_IN_GRAMMAR
    if isinstance(q, str):
        raise PodSpecError(f"{field}: {quote(value)} {q}")
    if q < 0 or (positive and q == 0):
        raise PodSpecError(f"{field}: {quote(value)} must be {'> 0' if positive else '>= 0'}")
    if q > maximum:
        raise PodSpecError(f"{field}: {quote(value)} is too large (at most {maximum}{unit})")
    return q


def fraction_milli(raw: object, field: str = ann.FRACTION) -> int:
    """``gpufrac.io/fraction``: a decimal in [0.001, 1], in milli-GPU (never 0)."""
    rule = "must be a decimal in [0.001, 1] with at most 3 decimal places, e.g. \"0.25\""
    if not isinstance(raw, str):
        raise PodSpecError(f"{field}: {quote(raw)} must be a string; {rule}")
    text = raw.strip()
    if not _FRACTION.fullmatch(text):
        raise PodSpecError(f"{field}: {quote(raw)} is not a plain decimal number; {rule}")
    value = Decimal(text)
    if not 0 < value <= 1:
        raise PodSpecError(f"{field}: {quote(raw)} is out of range; {rule}")
    milli = value * MILLI_PER_GPU
    if milli != milli.to_integral_value():
        raise PodSpecError(f"{field}: {quote(raw)} is finer than 1/1000 GPU; {rule}")
    return int(milli)
