"""benchmarks/README.md's churn tables are rows the churn command wrote, copied, never edited."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def churn_section() -> str:
    text = (REPO / "benchmarks" / "README.md").read_text()
    start = text.index("## Churn: pods that leave")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_every_row_of_the_churn_sections_tables_is_one_a_committed_churn_md_holds() -> None:
    rows = [line for line in churn_section().splitlines() if line.startswith("|")]
    written = {line for md in RESULTS.glob("churn-*/churn.md") for line in md.read_text().splitlines()}
    assert len(rows) > 20
    assert [r for r in rows if r not in written] == [], "copy the tables from the churn.md files the command wrote"
