"""The versioned inventory schema, and standalone cluster files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import trace
from extender.clusterfile import OPENB_GPU_MEMORY_MIB, load_cluster_file
from podspec import annotations as ann


def test_committed_schema_matches_the_model() -> None:
    committed = json.loads(ann.SCHEMA_PATH.read_text())
    assert committed == ann.inventory_json_schema()
    assert committed["properties"]["schema"]["const"] == "gpufrac.io/inventory/v1"


def test_inventory_round_trip() -> None:
    inv = ann.NodeInventory(node="n1", heartbeat="2026-11-22T00:00:00Z", gpus=[
        ann.GpuInventory(index=0, uuid="GPU-1", model="T4", memory_mib=15360, replicas=4)])
    text = ann.dump_inventory(inv)
    assert json.loads(text)["schema"] == "gpufrac.io/inventory/v1"
    assert ann.parse_inventory(text) == inv


@pytest.mark.parametrize(("doc", "message"), [
    ({"schema": "gpufrac.io/inventory/v2", "node": "n", "heartbeat": "2026-01-01T00:00:00Z", "gpus": []},
     "schema:"),
    ({"schema": "gpufrac.io/inventory/v1", "node": "n", "heartbeat": "2026-01-01T00:00:00Z",
      "gpus": [{"index": 0, "uuid": "u", "model": "T4", "memory_mib": 0}]}, "gpus.0.memory_mib"),
    ({"schema": "gpufrac.io/inventory/v1", "node": "n", "heartbeat": "yesterday", "gpus": []}, "heartbeat"),
    ({"schema": "gpufrac.io/inventory/v1", "node": "n", "heartbeat": "2026-01-01T00:00:00Z",
      "gpus": [{"index": 0, "uuid": "u", "model": "T4", "memory_mib": 1},
               {"index": 0, "uuid": "v", "model": "T4", "memory_mib": 1}]}, "duplicate GPU index"),
])
def test_invalid_inventory_names_the_field(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ann.parse_inventory(json.dumps(doc))


def test_openb_node_list_loads_directly() -> None:
    nodes = load_cluster_file(trace.DEFAULT_NODES, replicas_per_gpu=20)
    assert len(nodes) == 1213
    assert sum(len(n.gpus) for n in nodes) == 6212
    models = {g.model for n in nodes for g in n.gpus}
    assert models <= set(OPENB_GPU_MEMORY_MIB)
    assert len({g.uuid for n in nodes for g in n.gpus}) == 6212


def test_yaml_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("nodes:\n- name: a\n  cpu_milli: 8000\n  memory_mib: 1024\n  gpus:\n"
                    "  - {index: 0, uuid: GPU-x, model: A10, memory_mib: 24576, replicas: 3}\n")
    [node] = load_cluster_file(path)
    assert node.gpus[0].replicas == 3 and node.gpus[0].model == "A10"
    path.write_text("nodes:\n- name: a\n  cpu_milli: -1\n  memory_mib: 1\n")
    with pytest.raises(ValueError, match="nodes.0.cpu_milli"):
        load_cluster_file(path)


def test_json_cluster_file_is_the_yaml_document(tmp_path: Path) -> None:
    # The same nodes as YAML and as JSON (the fast form for big clusters) load the same.
    doc: dict[str, Any] = {"nodes": [{"name": f"n{i}", "cpu_milli": 8000, "memory_mib": 1024, "gpus": [
        {"index": g, "uuid": f"GPU-{i}-{g}", "model": "A10", "memory_mib": 24576, "replicas": 2}
        for g in range(2)]} for i in range(3)]}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    from_json = load_cluster_file(tmp_path / "c.json")
    assert from_json == load_cluster_file(tmp_path / "c.yaml")
    assert [n.name for n in from_json] == ["n0", "n1", "n2"] and from_json[2].gpus[1].uuid == "GPU-2-1"
    doc["nodes"][1]["gpus"][0]["memory_mib"] = "lots"
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="nodes.1.gpus.0.memory_mib"):
        load_cluster_file(tmp_path / "c.json")
    (tmp_path / "c.toml").write_text("")
    with pytest.raises(ValueError, match="must be .csv, .yaml or .json"):
        load_cluster_file(tmp_path / "c.toml")


def test_unknown_csv_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "n.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nx,1000,1024,1,H100\n")
    with pytest.raises(ValueError, match="model 'H100' has no known memory size"):
        load_cluster_file(path)
