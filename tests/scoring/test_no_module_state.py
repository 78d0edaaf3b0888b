"""No module-level mutable state in ``scoring/``: what is kept between evaluations lives in a
``scoring.memo.Memo`` with an owner (``scoring.incremental.IncrementalScorer``).

Every module of the package is imported and each value it defines at module level is
checked: constants (numbers, strings, enum members, frozen dataclasses, read-only arrays and
mappings, tuples and frozensets of those), functions and classes only. Functions memoised
with ``functools.lru_cache`` are allowed: they are pure functions of hashable, immutable
arguments, so what they kept never changes an answer. A ``global`` statement anywhere fails.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import pkgutil
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import scoring

MODULES = sorted(info.name for info in pkgutil.walk_packages(scoring.__path__, "scoring."))


def immutable(value: Any, seen: int = 0) -> bool:
    """Whether ``value`` cannot change (the rule of the module notes)."""
    if seen > 8:
        return False
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, range, np.generic,
                                           enum.Enum, typing.TypeVar)):
        return True
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType,
                          types.GenericAlias, typing._GenericAlias, types.UnionType)):  # type: ignore[attr-defined]
        return True
    if callable(value) and hasattr(value, "cache_info"):  # functools.lru_cache: see the notes
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(immutable(v, seen + 1) for v in value)
    if isinstance(value, types.MappingProxyType):
        return all(immutable(k, seen + 1) and immutable(v, seen + 1) for k, v in value.items())
    if isinstance(value, np.ndarray):
        return not value.flags.writeable
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        params = type(value).__dataclass_params__  # type: ignore[attr-defined]
        return bool(params.frozen) and all(immutable(getattr(value, f.name), seen + 1)
                                           for f in dataclasses.fields(value))
    return False


@pytest.mark.parametrize("name", MODULES)
def test_module_defines_no_mutable_value(name: str) -> None:
    module = importlib.import_module(name)
    mutable = [attr for attr, value in vars(module).items()
               if not attr.startswith("__") and not immutable(value)
               and getattr(value, "__module__", name) in (name, None, "builtins")]
    assert not mutable, f"{name}: module-level mutable values {mutable}"


@pytest.mark.parametrize("name", MODULES)
def test_module_has_no_global_statement(name: str) -> None:
    path = Path(importlib.import_module(name).__file__ or "")
    found = [node.lineno for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Global)]
    assert not found, f"{path}: global statement at lines {found}"


def test_the_check_finds_each_kind_of_mutable_value() -> None:
    # The rule is shown to catch what the five old caches were (a dict, a tuple holding a
    # dict, a WeakKeyDictionary, an object with state) and a writable array.
    import weakref

    class Counts:
        def __init__(self) -> None:
            self.rows: list[int] = []

    kinds: list[object] = [{}, (None, {}), weakref.WeakKeyDictionary(), Counts(), np.zeros(3), [1]]
    for value in kinds:
        assert not immutable(value), value
    ro = np.zeros(3)
    ro.setflags(write=False)
    assert immutable(ro) and immutable(types.MappingProxyType({"a": (1, 2)})) and immutable((1, "a"))
