"""``podspec.quantities.quantity``: the memoised parse answers as the parse does, call after call."""

from __future__ import annotations

from decimal import Decimal

import pytest

from podspec.quantities import QUANTITY_MEMO, PodSpecError, _value, quantity


@pytest.mark.parametrize(("raw", "want"), [("100m", Decimal("0.1")), ("64Mi", Decimal(64 * 2**20)),
                                           ("2", Decimal(2)), ("1.5e3", Decimal(1500)), (3, Decimal(3))])
def test_a_quantity_parses_the_same_each_time(raw: object, want: Decimal) -> None:
    assert [quantity(raw, "f", maximum=10**12) for _ in range(3)] == [want] * 3


@pytest.mark.parametrize(("raw", "rule"), [("lots", "is not a Kubernetes quantity (e.g."),
                                           ("1e-999999", "is not a Kubernetes quantity (e.g."),
                                           ("x" * 65, "is not a Kubernetes quantity (e.g."),
                                           ("-1", "must be >= 0"), ("2Ei", "is too large")])
def test_a_refusal_names_each_field_every_time(raw: str, rule: str) -> None:
    # The memo keeps a value per text, never the field: each call's message names its own.
    for field in ("a.cpu", "b.memory", "a.cpu"):
        with pytest.raises(PodSpecError) as err:
            quantity(raw, field, maximum=10**12)
        assert str(err.value).startswith(f"{field}: ") and rule in str(err.value)


def test_the_memo_is_bounded() -> None:
    for i in range(QUANTITY_MEMO + 100):
        quantity(f"{i}m", "f", maximum=10**12)
    assert _value.cache_info().currsize <= QUANTITY_MEMO
