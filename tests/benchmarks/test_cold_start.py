"""A fresh cluster of notebooks keeps whole nodes for its first training job (issue 36).

Through the verbs, as kube-scheduler calls them (``benchmarks.cold_start``: filter,
prioritize, selectHost, bind, with the shipped scheduler config), on a cluster ten times
smaller than the benchmark's.
"""

from __future__ import annotations

import numpy as np

from benchmarks import cold_start
from extender.admin_config import scoring_config
from extender.cache import GpuCache
from podspec.pods import pod_intent
from scoring.scorer import build_scorer


def test_quarter_notebooks_leave_whole_nodes() -> None:
    # 50 nodes x 8 A100 = 400 GPUs; 6 % of them is 24 GPUs = floor(0.06 * 400 / 0.25) = 96
    # quarter-GPU pods, which fill exactly 24 GPUs = 3 nodes (a node takes 8 * 4 = 32 of
    # them; 32 * 2 cores = 64 of its 96 cores, so CPU does not stop the packing).
    # Before the shape prior the default spread them over all 50 nodes, one GPU each
    # at 50 %, and no 8-GPU pod fitted anywhere.
    r = cold_start.run_one("default", 0.25, 0.06, n_nodes=50, gpus_per_node=8)
    assert r.placed == r.pods == 96
    assert r.nodes_touched <= 4
    assert r.fits_next["8"] >= 46  # 50 - 4
    spread = cold_start.run_one("kube-scheduler", 0.25, 0.06, n_nodes=50, gpus_per_node=8)
    assert spread.nodes_touched == 50 and spread.fits_next["8"] == 0  # what the prior is for


def test_half_full_of_one_gpu_pods_keeps_half_the_nodes_whole() -> None:
    # 50 % of 50 x 8 GPUs: 200 one-GPU pods = 25 nodes' worth. Bestfit fills 25 nodes and
    # leaves 25 empty; so must the default. Before the keep-whole band the balance terms put
    # an empty node 1e-4 to 5e-4 ahead of a used one, and the pods spread over nearly every
    # node (on 500 nodes: 463 touched, an 8-GPU pod fitted on 37 against bestfit's 250).
    # The band holds only while no whole-node pod has been counted: then the prior alone
    # speaks for 8-GPU pods.
    default = cold_start.run_one("default", 1.0, 0.5, n_nodes=50, gpus_per_node=8)
    bestfit = cold_start.run_one("bestfit", 1.0, 0.5, n_nodes=50, gpus_per_node=8)
    assert default.placed == bestfit.placed == 200
    assert bestfit.nodes_touched == 25 and bestfit.fits_next["8"] == 25
    assert default.nodes_touched == 25 and default.fits_next == bestfit.fits_next


def test_half_gpu_pods_after_one_whole_node_pod_keep_nodes_whole() -> None:
    # One 8-GPU pod, then half-GPU pods to 50 % of 100 x 8 GPUs. With the learned mix
    # holding one multi-GPU pod, adaptive_balance put an empty node 1.01e-3 ahead of a node
    # of 8 half-GPU pods: with a band of 1e-3 the default touched 68 nodes (bestfit 51) and
    # an 8-GPU pod then fitted on 32 (bestfit 49); on 500 nodes 468 against 251.
    default = cold_start.run_one("default", 0.5, 0.5, n_nodes=100, gpus_per_node=8, first_gpu=8)
    bestfit = cold_start.run_one("bestfit", 0.5, 0.5, n_nodes=100, gpus_per_node=8, first_gpu=8)
    assert default.placed == bestfit.placed == 800
    assert bestfit.nodes_touched == 51 and bestfit.fits_next["8"] == 49
    assert default.nodes_touched == bestfit.nodes_touched and default.fits_next == bestfit.fits_next


def test_four_gpu_pods_pair_up_on_nodes() -> None:
    # 60 % of 50 x 8 GPUs in 4-GPU pods: 60 pods, two per node = 30 nodes. spare_nodes
    # counts 4-GPU slots (floor(free / 4) per node): a second pod on a half-used node closes
    # one slot, as the first pod on an empty node does, so they no longer spread one per node.
    r = cold_start.run_one("default", 4.0, 0.6, n_nodes=50, gpus_per_node=8)
    assert r.placed == 60 and r.nodes_touched == 30 and r.fits_next["8"] == 20


def test_learned_workload_is_the_same_after_a_restart_and_on_every_replica() -> None:
    specs = cold_start.cluster(8, 8)
    scorer = build_scorer(scoring_config("default"))
    pending = [pod_intent(cold_start.pod(s, f"w{i}")) for i, s in enumerate([0.25, 0.5, 8.0, 0.25])]
    a, b = GpuCache(scorer), GpuCache(scorer)
    a.set_nodes(specs)
    for intent in pending:  # replica a: the watch's events, one by one
        a.apply_pod_event("ADDED", intent)
    b.set_pods(reversed(pending))  # replica b (or a restart): the list, in another order
    b.set_nodes(specs)  # and the nodes after the pods
    ta, tb = a.state_copy().workload.task_types(), b.state_copy().workload.task_types()
    assert ta is not None and tb is not None
    for field in ("gpu_count", "gpu_milli", "cpu_milli", "memory_mib", "count"):
        assert np.array_equal(getattr(ta, field), getattr(tb, field)), field
    assert ta.demand == tb.demand
    names = [s.name for s in specs]
    probe = pod_intent(cold_start.pod(0.5, "probe"))
    ea, eb = a.evaluate(probe, names).evaluation, b.evaluate(probe, names).evaluation
    assert ea.score.tolist() == eb.score.tolist() and ea.best() == eb.best()


def test_one_whole_node_pod_seen_first_does_not_let_the_notebooks_spread() -> None:
    # One 8-GPU pod, then 6 % of 400 x 8 GPUs in quarter-GPU pods (768: 24 nodes' worth). The
    # band used to switch off once one whole-node pod was counted, and the 8-GPU shape then
    # weighed 1 pod + 1 pseudo-pod instead of the prior's 8: the default touched 33 nodes
    # here (45 against 31 on the benchmark's 500). It now stands until as many whole-node
    # pods have been counted as the prior is worth (ShapePrior.pods = 8). (At 50 or 200 nodes
    # the old rule packed as well: the spread needs a cluster this large.)
    default = cold_start.run_one("default", 0.25, 0.06, n_nodes=400, gpus_per_node=8, first_gpu=8)
    bestfit = cold_start.run_one("bestfit", 0.25, 0.06, n_nodes=400, gpus_per_node=8, first_gpu=8)
    assert default.placed == bestfit.placed == 768
    assert bestfit.nodes_touched == 25  # the 8-GPU pod's node and 24 of notebooks
    assert default.nodes_touched == bestfit.nodes_touched and default.fits_next == bestfit.fits_next
