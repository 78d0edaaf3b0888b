"""``GpuModelsPublisher``: the GPU models the cluster's nodes have, for the admission policy.

The ``gpufrac-gpu-models`` ValidatingAdmissionPolicy (chart and ``deploy/base``) refuses, when
a pod is created, a ``gpufrac.io/gpu-model`` naming a model no node has, with a did-you-mean
for a name that differs only in case. CEL in the API server cannot read the nodes'
inventories, so the policy reads a ConfigMap as its parameter, and this loop keeps it: every
``poll_s`` it takes the model names of every GPU the cache knows (``GpuCache.metrics_view``,
which never waits on a verb) and writes them, sorted and comma-separated, to
``data.models`` of that ConfigMap when they differ from what is there. The install creates
the ConfigMap without data, so the grant is get and patch of that one object; the patch
carries the ``resourceVersion`` it read, so two replicas never overwrite each other blindly
(a conflict is retried on the next pass, and replicas converge as their watches do).

Model names are what agents wrote in their inventories: untrusted. More than ``MAX_MODELS``
distinct names, or a name with a comma (the separator), publish an empty list, and the
policy then checks nothing: the check fails open, never refusing pods because of what
another object claims. A missing ConfigMap is logged (the policy, with
``parameterNotFoundAction: Allow``, checks nothing either). Every API call has a timeout; a
failed pass is logged and retried, never raised out of the loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from extender.cluster.objects import MERGE_PATCH
from podspec.kubeio import drain, response_json

log = logging.getLogger(__name__)

MAX_MODELS = 64
"""Most distinct model names published; past it, none (the policy checks nothing)."""

KEY = "models"
"""The ConfigMap's data key the policy reads."""


@dataclass(frozen=True, slots=True)
class ModelsOptions:
    """Where ``GpuModelsPublisher`` writes; seconds.

    Attributes
    ----------
    namespace, name : str
        The ConfigMap (``--gpu-models-configmap NAMESPACE/NAME``).
    poll_s : float
        Period of a pass.
    api_timeout_s : float
        Limit of each API call.
    """

    namespace: str
    name: str
    poll_s: float = 10.0
    api_timeout_s: float = 5.0


def published_value(models: Iterable[str]) -> str:
    """``data.models`` for these names: sorted, unique, comma-separated; ``""`` (the policy checks
    nothing) for more than ``MAX_MODELS`` names or a name with a comma (module notes)."""
    names = sorted(set(models))
    if len(names) > MAX_MODELS or any("," in n for n in names):
        return ""
    return ",".join(names)


class GpuModelsPublisher:
    """Keeps the admission policy's ConfigMap of GPU models (module notes).

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    models : callable
        The model names of the GPUs known now (one per GPU; repeats allowed).
    options : ModelsOptions
    ready : callable, optional
        False until the cache holds every node (the first full sync): a pass before it writes
        nothing, since a partial list would refuse pods asking for the models not yet seen.
    """

    def __init__(self, api: Any, models: Callable[[], Iterable[str]], options: ModelsOptions,
                 ready: Callable[[], bool] = lambda: True) -> None:
        self._api, self._models, self._opts, self._ready = api, models, options, ready
        self._last_outcome = ""

    def loop(self, stop: threading.Event) -> None:
        """A pass every ``poll_s`` until ``stop`` (the first at once); never raises. Until the
        cache is synced, a pass a second."""
        while True:
            outcome = ""
            try:
                outcome = self.publish_once()
            except Exception:  # noqa: BLE001 - never let the loop die
                log.exception("publishing the GPU models failed")
            if stop.wait(min(1.0, self._opts.poll_s) if outcome == "not synced" else self._opts.poll_s):
                return

    def publish_once(self) -> str:
        """One pass: read the ConfigMap, write the models if they differ.

        Returns
        -------
        str
            ``"unchanged"``, ``"written"``, ``"missing"`` (no such ConfigMap), ``"not synced"``
            (nothing read or written yet) or ``"error: ..."`` (the API refused or did not
            answer; retried next pass).
        """
        opts = self._opts
        if not self._ready():
            return "not synced"
        value = published_value(self._models())
        try:
            current = response_json(self._api.read_namespaced_config_map(
                opts.name, opts.namespace, _preload_content=False, _request_timeout=opts.api_timeout_s))
            data = current.get("data") or {}
            if data.get(KEY) == value:
                return self._tell("unchanged", value)
            patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "data": {KEY: value}}
            drain(self._api.patch_namespaced_config_map(opts.name, opts.namespace, patch, _content_type=MERGE_PATCH,
                                                        _preload_content=False, _request_timeout=opts.api_timeout_s))
            return self._tell("written", value)
        except ApiException as exc:
            if exc.status == 404:
                return self._tell("missing", value)
            return self._tell(f"error: {exc.status} {exc.reason}", value)
        except Exception as exc:  # noqa: BLE001 - the API is a neighbour: retry next pass
            return self._tell(f"error: {type(exc).__name__}: {exc}"[:200], value)

    def _tell(self, outcome: str, value: str) -> str:
        """Log a write always, and any other outcome when it changes (not every pass)."""
        where = f"{self._opts.namespace}/{self._opts.name}"
        if outcome == "written":
            log.info("GPU models for the admission policy written to ConfigMap %s: %s", where,
                     value or "(none: the policy checks no model)")
        elif outcome != self._last_outcome and outcome != "unchanged":
            log.warning("GPU models for the admission policy not written: ConfigMap %s %s", where,
                        "does not exist (the policy checks no model)" if outcome == "missing" else outcome)
        self._last_outcome = outcome
        return outcome
