"""Inbound: an extender request becomes what the core evaluates, once, at the boundary.

``ExtenderArgs`` -> the pod's ``PodIntent`` (``podspec.pod``) and its candidate names;
``PodIntent`` -> ``scoring.PodRequest`` against the state's model ids; names -> state rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from podspec.pods import MAX_NAME_CHARS, PodIntent, item_name, pod_intent
from scoring.request import MILLI_PER_GPU, PodRequest
from scoring.state import ClusterState


def pod_request(intent: PodIntent, state: ClusterState) -> PodRequest:
    """Resolve a ``PodIntent`` against the state's model ids.

    A model name no node has resolves to no id, so every node fails the model check and
    the failure message names the models the pod asked for.
    """
    models = None if intent.gpu_models is None else state.model_ids(intent.gpu_models)
    return PodRequest(
        gpu_count=intent.gpu_count,
        gpu_milli=intent.gpu_milli if intent.gpu_count else MILLI_PER_GPU,
        gpu_memory_mib=intent.gpu_memory_mib,
        allowed_models=models,
        qos=intent.qos,
        cpu_milli=intent.cpu_milli,
        memory_mib=intent.memory_mib,
    )


def extender_args(pod: Mapping[str, Any], node_items: Sequence[Any] | None,
                  node_names: Sequence[str] | None) -> tuple[PodIntent, list[str]]:
    """The pod and candidate names of an ``ExtenderArgs`` (``filter``, ``prioritize``).

    A Node listed twice in ``Nodes`` is kept once (its first place). ``NodeNames`` come
    back as sent: ``GpuCache.evaluate`` drops repeats there, where it looks the names up
    anyway (kube-scheduler never sends any, and a node must not get two answers).

    Parameters
    ----------
    pod : mapping
        ``ExtenderArgs.Pod``.
    node_items : sequence or None
        ``ExtenderArgs.Nodes.items`` (nodeCacheCapable false), else None.
    node_names : sequence of str or None
        ``ExtenderArgs.NodeNames`` (nodeCacheCapable true), else None.

    Raises
    ------
    ValueError
        When neither node form is given, or a Node is not an object with a name;
        ``PodSpecError`` for the pod.
    """
    if node_names is not None:
        names = list(node_names)
    elif node_items is not None:
        names = []
        for i, item in enumerate(node_items):
            name = item_name(item)
            if name is None:
                raise ValueError(f"Nodes.items[{i}].metadata.name: missing or not a name of at most "
                                 f"{MAX_NAME_CHARS} characters")
            names.append(name)
        names = list(dict.fromkeys(names))
    else:
        raise ValueError("ExtenderArgs: one of NodeNames or Nodes is required")
    return pod_intent(pod), names


def has_repeats(rows: NDArray[np.int64], n_rows: int) -> bool:
    """Whether a row appears twice in ``rows`` (values in ``[0, n_rows)``)."""
    return rows.size > 1 and int(np.bincount(rows, minlength=n_rows).max()) > 1


def rows_for_names(state: ClusterState, names: Sequence[str]) -> tuple[NDArray[np.int64], list[str]]:
    """State rows of the known names (in the given order) and the unknown names."""
    rows = np.fromiter(map(state.node_index.get, names, itertools.repeat(-1)), dtype=np.int64, count=len(names))
    missing = rows < 0
    if not missing.any():
        return rows, []
    return rows[~missing], [names[i] for i in np.flatnonzero(missing).tolist()]
