"""The DRA allocator's first fit inside a node, as the replay emulates it (benchmarks/dra_allocator.py)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from benchmarks import replay
from benchmarks.dra_allocator import FirstFitDevicesClient, split_device_choice
from benchmarks.extender_client import InProcessClient
from extender.admin_config import AdminConfig, scoring_config
from podspec import annotations as ann
from tests.conftest import gpu_node, pod_json


def _arrive(client: InProcessClient, name: str, **kwargs: Any) -> dict[str, Any]:
    pod = pod_json(name, **kwargs)
    client.pod_events([{"type": "ADDED", "object": pod}])
    return pod


def _gpus_of(client: InProcessClient) -> dict[str, list[str]]:
    return {a["name"]: list(a["gpu_uuids"]) for a in client.get("allocations")}


def test_first_fit_takes_the_first_gpus_with_room_in_inventory_order_and_gpufrac_counts_them() -> None:
    # Two GPUs, the first already holding a quarter: gpufrac's own bind puts a half-GPU pod
    # beside it (best fit: the tighter GPU)... and so does first fit, on GPU 0. A second
    # quarter then goes to GPU 0 under first fit (the first with room), and a whole-GPU pod
    # to GPU 1; one more half fits nowhere: no GPU has 500 milli left.
    client = FirstFitDevicesClient([gpu_node("a", 2)], AdminConfig(scoring_config("default")))
    for name, share in (("q1", "0.25"), ("h1", "0.5"), ("q2", "0.25")):
        assert client.bind(_arrive(client, name, annotations={ann.FRACTION: share}), "a") == ""
    assert client.bind(_arrive(client, "w1", gpus=1), "a") == ""
    assert _gpus_of(client) == {"q1": ["GPU-a-0"], "h1": ["GPU-a-0"], "q2": ["GPU-a-0"], "w1": ["GPU-a-1"]}
    err = client.bind(_arrive(client, "h2", annotations={ann.FRACTION: "0.5"}), "a")
    assert err == "dra-first-fit: pod default/h2 fits no 1 GPU(s) of a"
    assert client.bind(_arrive(client, "cpu", gpus=None), "a") == ""  # no device: gpufrac's bind
    assert client.bind(_arrive(client, "q3", annotations={ann.FRACTION: "0.25"}), "b").startswith(
        "dra-first-fit: node 'b' unknown")


def test_first_fit_differs_from_gpufrac_where_the_first_gpu_is_not_the_tightest() -> None:
    # GPU 0 holds a quarter, GPU 1 three quarters: a quarter-GPU pod fills GPU 1 exactly under
    # gpufrac's choice, and lands on GPU 0 (the first with room) under first fit.
    chosen = {}
    for cls in (InProcessClient, FirstFitDevicesClient):
        client = cls([gpu_node("a", 2)], AdminConfig(scoring_config("default")))
        assert client.bind(_arrive(client, "q", annotations={ann.FRACTION: "0.25"}), "a") == ""
        # "t" was bound by someone else (the watch shows it): on GPU 1, by its allocation record.
        t = pod_json("t", annotations={ann.FRACTION: "0.75", ann.ASSIGNED_GPUS: "GPU-a-1",
                                       ann.ASSIGNED_FRACTION: "0.75", ann.ASSIGNED_MEMORY: "12288Mi",
                                       ann.ASSIGNED_AT: "2026-01-01T00:00:00Z"}, node="a", phase="Running")
        client.pod_events([{"type": "ADDED", "object": t}])
        assert client.bind(_arrive(client, "r", annotations={ann.FRACTION: "0.25"}), "a") == ""
        chosen[cls.__name__] = _gpus_of(client)["r"]
    assert chosen == {"InProcessClient": ["GPU-a-1"], "FirstFitDevicesClient": ["GPU-a-0"]}


def test_the_suffix_names_the_emulation_and_the_http_replay_refuses_it() -> None:
    assert split_device_choice("default+dra-first-fit") == ("default", True)
    assert split_device_choice("fgd") == ("fgd", False)
    args = argparse.Namespace(nodes="benchmarks/traces/openb/openb_node_list_gpu_node.csv",
                              pods="benchmarks/traces/openb/openb_pod_list_default.csv", replicas_per_gpu=4,
                              model_constrained=0, memory_requests=0, preset="default+dra-first-fit",
                              in_process=False, url=None, config=None)
    with pytest.raises(ValueError, match="in process only"):
        replay._run_seeds(args, replay.profile_from_args(argparse.Namespace(
            scheduler_config=replay.DEFAULT_SCHEDULER_CONFIG, node_cache_capable=None,
            percentage_of_nodes_to_score=None)), [42], 0)
