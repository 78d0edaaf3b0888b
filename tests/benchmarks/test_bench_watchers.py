"""``bench watchers``: the medians it reports, over the rounds, per setup."""

from __future__ import annotations

from benchmarks.bench_watchers import SETUPS, summary


def test_the_summary_is_each_setups_median_over_its_rounds() -> None:
    rows = [{"setup": s, "round": r, "apiserver_ms_per_update": v}
            for r, values in enumerate([(3.0, 4.0, 5.0), (2.0, 9.0, 4.5), (10.0, 3.5, 4.0)])
            for s, v in zip(SETUPS, values, strict=True)]
    assert summary(rows) == {"kube-scheduler's watch": 3.0, "+ JSON watch": 4.0, "+ protobuf watch": 4.5}
    assert summary(rows[:1]) == {"kube-scheduler's watch": 3.0}  # a run cut short: the setups it ran
