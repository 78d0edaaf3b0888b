"""``RowContents``: one id per distinct row content, kept by row version."""

from __future__ import annotations

import numpy as np
import pytest

from scoring import row_contents
from scoring.request import QoSClass
from scoring.row_contents import ROW_ARRAYS, RowContents, row_keys
from scoring.specs import Allocation
from scoring.state import ClusterState
from tests.conftest import gpu_node


def cluster(n: int = 7) -> ClusterState:
    return ClusterState.from_nodes([gpu_node(f"n{i}", 3) for i in range(n)])


def test_every_per_row_array_of_the_state_is_part_of_a_content() -> None:
    # A field added to ClusterState later is a content too, or two rows that differ in it
    # would share an evaluation: found by shape, not by a list kept by hand.
    st = cluster(7)
    per_row = {name for name in dir(st) if not name.startswith("_")
               and isinstance(getattr(st, name, None), np.ndarray) and getattr(st, name).shape[:1] == (7,)}
    assert per_row - {"row_version"} == set(ROW_ARRAYS)


def test_equal_rows_share_an_id_and_a_change_gives_a_new_one() -> None:
    st, contents = cluster(), RowContents()
    rows = np.arange(st.n_nodes, dtype=np.int64)
    assert len(set(contents.ids(st, rows).tolist())) == 1  # seven alike empty nodes
    quarter = Allocation("n2", (1,), 250, (4096,), QoSClass.BURSTABLE, 1000, 1024)
    st.apply(quarter)
    ids = contents.ids(st, rows)
    assert ids[2] != ids[0] and len(set(ids.tolist())) == 2
    st.apply(Allocation("n5", (1,), 250, (4096,), QoSClass.BURSTABLE, 1000, 1024))
    assert contents.ids(st, rows)[5] == ids[2]  # the same quarter on the same GPU: the same content
    st.apply(Allocation("n6", (0,), 250, (4096,), QoSClass.BURSTABLE, 1000, 1024))
    assert contents.ids(st, rows)[6] not in (ids[0], ids[2])  # another GPU: another content
    st.apply(quarter, sign=-1)
    assert contents.ids(st, rows)[2] == ids[0]  # released: empty again


def test_a_row_is_read_again_only_when_its_version_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    st, contents = cluster(), RowContents()
    rows = np.arange(st.n_nodes, dtype=np.int64)
    contents.ids(st, rows)
    read: list[int] = []

    def counted(state: ClusterState, which: np.ndarray) -> list[bytes]:
        read.extend(which.tolist())
        return row_keys(state, which)

    monkeypatch.setattr(row_contents, "row_keys", counted)
    contents.ids(st, rows)
    assert read == []
    st.set_nvml_used_mib(4, [100, 0, 0])
    contents.ids(st, rows)
    assert read == [4]


def test_past_max_contents_every_id_is_given_anew() -> None:
    st, contents = cluster(), RowContents(max_contents=3)
    rows = np.arange(st.n_nodes, dtype=np.int64)
    for i in range(st.n_nodes):
        st.apply(Allocation(f"n{i}", (0,), 100 * (i + 1), (1024,), QoSClass.BURSTABLE, 0, 0))
    ids = contents.ids(st, rows)  # seven contents in one call: held until the next call
    assert len(set(ids.tolist())) == 7 and contents.epoch == 1
    again = contents.ids(st, rows)
    assert contents.epoch == 2 and len(set(again.tolist())) == 7


def test_keys_read_row_by_row_or_gathered_are_the_same() -> None:
    st = cluster(12)
    st.apply(Allocation("n3", (2,), 500, (8192,), QoSClass.GUARANTEED, 2000, 4096))
    rows = np.array([3, 0, 11, 3], dtype=np.int64)
    few = row_keys(st, rows)
    gathered = row_keys(st, np.concatenate([rows, np.arange(12, dtype=np.int64)]))[:4]
    assert few == gathered and few[0] == few[3] and few[0] != few[1] and few[1] == few[2]
    assert row_keys(st, np.zeros(0, dtype=np.int64)) == []
