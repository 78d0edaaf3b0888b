"""The cache evaluates a pod once: filter, prioritize and bind answer from kept rows, never stale ones."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from extender.admin_config import scoring_config
from extender.cache import GpuCache
from extender.translate import inbound
from extender.verbs.filter import ExtenderArgs, filter
from extender.verbs.prioritize import prioritize
from podspec import annotations as ann
from podspec.pods import pod_intent
from scoring import request as request_module
from scoring.drift import EXACT
from scoring.scorer import build_scorer
from scoring.state import ClusterState
from tests.conftest import gpu_node, pod_json

SHAPES = [("0.25", "2", "4Gi"), ("0.5", "4", "8Gi"), ("1", "8", "16Gi"), ("0.75", "1", "2Gi")]


def test_every_verb_answers_as_a_full_evaluation_would(rng: np.random.Generator) -> None:
    # 80 pods of four shapes arrive, are filtered on every node (in a shuffled order), bound
    # where the filter's scores put them, and a fifth of the bound ones are deleted; with the
    # exact tolerance each filter's answer equals Scorer.evaluate on a copy of the state, and
    # every bind takes the GPUs that evaluation chose on the best node.
    scorer = build_scorer(scoring_config("default"))
    cache = GpuCache(scorer, EXACT)
    nodes = [gpu_node(f"n{i:02d}", (8, 4, 2)[i % 3]) for i in range(12)]
    cache.set_nodes(nodes)
    bound: list[str] = []
    for i in range(80):
        share, cpu, mem = SHAPES[int(rng.integers(len(SHAPES)))]
        intent = pod_intent(pod_json(f"p{i}", annotations={"gpufrac.io/fraction": share}, cpu=cpu, memory=mem))
        cache.apply_pod_event("ADDED", intent)
        names = [nodes[j].name for j in rng.permutation(len(nodes))]
        got = cache.evaluate(intent, names).evaluation
        state = cache.state_copy()
        rows = np.array([state.node_index[n] for n in names])
        want = scorer.evaluate(state, inbound.pod_request(intent, state), rows)
        for field in ("node_fits", "reason", "score", "chosen_cols", "chosen_mem_mib"):
            assert np.array_equal(getattr(got, field), getattr(want, field)), (i, field)
        best = got.best()
        if best < 0:
            continue
        rec = cache.bind(intent.uid, intent.namespace, intent.name, names[best])
        assert rec.allocation is not None
        assert rec.allocation.gpu_cols == tuple(int(c) for c in want.chosen_cols[best])
        bound.append(intent.uid)
        if rng.random() < 0.2:
            cache.remove_pod(bound.pop(int(rng.integers(len(bound)))))
    assert len(bound) > 30


def test_a_filter_converts_its_names_mask_and_request_once_and_prioritize_converts_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The conversions of translate.inbound are counted on a filter whose NodeNames repeat two
    # nodes and name one gpufrac does not know, then on the prioritize kube-scheduler sends
    # next: the filter parses, resolves the names (dropping the repeats in the same pass),
    # builds the request and its model mask once each; prioritize reuses all of it.
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([gpu_node("a", 4), gpu_node("b", 2, model="A100"), gpu_node("c", 8)])
    calls: Counter[str] = Counter()

    def counted(owner: object, name: str) -> None:
        real = getattr(owner, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            calls[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, wrapper)

    for name in ("extender_args", "candidates", "rows_for_names", "pod_request", "model_mask_of"):
        counted(inbound, name)
    counted(request_module, "model_mask")
    counted(ClusterState, "model_ids")
    pod = pod_json("m", annotations={ann.FRACTION: "0.5", ann.GPU_MODEL: "T4"})
    names = ["a", "b", "a", "ghost", "c", "c"]
    reply = filter(cache, ExtenderArgs(Pod=pod, NodeNames=names), decide=False)
    assert reply.body["Error"] == ""
    assert sorted(reply.body["NodeNames"]) == ["a", "c"]
    assert list(reply.body["FailedNodes"]) == ["ghost"]  # each once
    assert list(reply.body["FailedAndUnresolvableNodes"]) == ["b"]  # the model: preemption cannot help
    assert calls == {"extender_args": 1, "candidates": 1, "rows_for_names": 2,  # the second after repeats
                     "pod_request": 1, "model_ids": 1}, calls
    calls.clear()
    ranked = prioritize(cache, ExtenderArgs(Pod=pod, NodeNames=reply.body["NodeNames"]))
    assert sorted(h["Host"] for h in ranked.body) == ["a", "c"]
    assert calls == {"extender_args": 1}, calls  # parsing the body; nothing converted again
    calls.clear()
    other = pod_json("n", annotations={ann.FRACTION: "0.25", ann.GPU_MODEL: "T4"})
    filter(cache, ExtenderArgs(Pod=other, NodeNames=["a", "b", "c"]), decide=False)
    assert calls == {"extender_args": 1, "candidates": 1, "rows_for_names": 1, "pod_request": 1,
                     "model_ids": 1}, calls  # no repeats: one lookup


def test_a_bind_resolves_the_model_names_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 56: a bind resolved the pod's GPU model names to ids twice, for its request
    # (inbound.pod_request) and again for the workload key of the pending record it replaces
    # (records.task_key). The pending record's key is kept from its pod event, so the bind
    # resolves once and builds the model mask once, from its request.
    cache = GpuCache(build_scorer(scoring_config("default")))
    cache.set_nodes([gpu_node("a", 4, model="T4"), gpu_node("b", 2, model="A100")])
    pod = pod_intent(pod_json("m", annotations={ann.FRACTION: "0.5", ann.GPU_MODEL: "T4"}))
    cache.apply_pod_event("ADDED", pod)
    before = cache.state_copy().workload
    calls: Counter[str] = Counter()
    for owner, name in ((ClusterState, "model_ids"), (inbound, "model_mask_of"), (inbound, "pod_request")):
        real = getattr(owner, name)

        def wrapper(*args: object, _real: object = real, _name: str = name, **kwargs: object) -> object:
            calls[_name] += 1
            return _real(*args, **kwargs)  # type: ignore[operator]
        monkeypatch.setattr(owner, name, wrapper)
    rec = cache.bind(pod.uid, pod.namespace, pod.name, "a")
    assert rec.allocation is not None and rec.gpu_uuids
    assert calls == {"model_ids": 1, "pod_request": 1}, calls
    # ...and the pending pod left the workload's demand exactly as its event counted it.
    assert before.pending_share() == 500
    assert cache.state_copy().workload.pending_share() == 0


def test_bind_takes_the_filters_row_when_nothing_changed_and_evaluates_anew_when_something_did() -> None:
    # kube-scheduler binds right after filter: with no change in between, bind's re-check is
    # the row filter scored (no second evaluation); a pod placed meanwhile on that node makes
    # bind evaluate the node again, and choose what a fresh evaluation chooses.
    scorer = build_scorer(scoring_config("default"))
    cache = GpuCache(scorer, EXACT)
    cache.set_nodes([gpu_node("a", 2), gpu_node("b", 2)])
    pods = [pod_intent(pod_json(f"p{i}", annotations={"gpufrac.io/fraction": "0.5"})) for i in range(3)]
    for p in pods:
        cache.apply_pod_event("ADDED", p)
    incremental = cache._evaluator._incremental  # noqa: SLF001 - what the test counts
    ev = cache.evaluate(pods[0], ["a", "b"])
    node = ["a", "b"][ev.evaluation.best()]
    before = incremental.stats.evaluations
    rec = cache.bind(pods[0].uid, "default", "p0", node)
    assert incremental.stats.evaluations == before
    assert rec.allocation is not None
    assert rec.allocation.gpu_cols == tuple(int(c) for c in ev.evaluation.chosen_cols[ev.evaluation.best()])
    cache.evaluate(pods[1], ["a", "b"])
    cache.bind(pods[2].uid, "default", "p2", node)         # another bind on the node in between
    state = cache.state_copy()
    want = scorer.evaluate(state, inbound.pod_request(pods[1], state), np.array([state.node_index[node]]))
    before = incremental.stats.evaluations
    rec = cache.bind(pods[1].uid, "default", "p1", node)
    assert incremental.stats.evaluations == before + 1
    assert rec.allocation is not None and rec.allocation.gpu_cols == tuple(int(c) for c in want.chosen_cols[0])
