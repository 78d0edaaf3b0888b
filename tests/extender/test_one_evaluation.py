"""The cache evaluates a pod once: filter, prioritize and bind answer from kept rows, never stale ones."""

from __future__ import annotations

import numpy as np

from extender.cache import GpuCache
from extender.settings import scoring_config
from extender.translate import inbound
from podspec.pods import pod_intent
from scoring.incremental import EXACT
from scoring.scorer import build_scorer
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
