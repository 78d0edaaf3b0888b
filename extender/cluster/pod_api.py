"""The pod calls of a bind: read a pod the watch has not shown yet, create its Binding, and,
after a 409, read whether it is bound where the bind meant it to be.

Functions of the ``kubernetes`` client and the cache, no state: ``KubeBinder`` calls them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.cache import BindError, GpuCache
from podspec.kubeio import core_path, response_json, write_json
from podspec.pods import pod_intent


def read_pod(api: client.CoreV1Api, cache: GpuCache, uid: str, namespace: str, name: str, timeout_s: float) -> None:
    """Read pod ``namespace/name`` once and apply it to ``cache`` as ``ADDED`` (a bind may come
    before the pod watch delivered the pod).

    Raises
    ------
    BindError
        The pod cannot be read, is not the pod ``uid`` (recreated), or does not parse.
    """
    try:
        obj = response_json(api.read_namespaced_pod(name, namespace, _preload_content=False,
                                                    _request_timeout=timeout_s))
    except ApiException as exc:
        raise BindError(f"gpufrac: reading pod {namespace}/{name}: {exc.status} {exc.reason}") from None
    except (OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
        raise BindError(f"gpufrac: reading pod {namespace}/{name}: {type(exc).__name__}") from None
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or meta.get("uid") != uid:
        raise BindError(f"gpufrac: pod {namespace}/{name} has another UID than {uid} (recreated)")
    try:
        intent = pod_intent(obj)
    except ValueError as exc:
        raise BindError(f"gpufrac: pod {namespace}/{name}: {exc}") from None
    cache.apply_pod_event("ADDED", intent)


def create_binding(api: client.CoreV1Api, uid: str, namespace: str, name: str, node: str,
                   annotations: Mapping[str, str], timeout_s: float) -> None:
    """Bind the pod to ``node`` with ``annotations`` (the allocation record), one API call.

    Atomic: the API server copies a Binding's annotations onto the pod in the write that
    sets ``spec.nodeName`` (``BindingREST.setPodNodeAndMetadata``,
    ``pkg/registry/core/pod/storage/storage.go``). A pod is never bound without its
    allocation record, nor annotated without being bound, so a failure leaves nothing to
    undo in the API. ``metadata.uid`` makes it fail rather than bind a recreated pod. The
    API answers a Status, which is not read further.

    Raises
    ------
    kubernetes.client.rest.ApiException
        As ``podspec.kubeio.write_json``.
    """
    write_json(api, "POST", *binding(uid, namespace, name, node, annotations), timeout_s=timeout_s)


def binding(uid: str, namespace: str, name: str, node: str,
            annotations: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """The API path and body of ``create_binding``'s write (``extender.cluster.loop_api`` sends
    the same one from the event loop)."""
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": dict(annotations)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    return core_path("namespaces", namespace, "pods", name, "binding"), body


def bound_there(api: client.CoreV1Api, cache: GpuCache, uid: str, namespace: str, name: str, node: str,
                timeout_s: float) -> bool:
    """After a 409: True when the pod is bound to ``node`` already; the cache then counts the
    allocation record the pod carries (another instance's Binding of the same pod may have
    landed first, on other GPUs). False when it is not, or cannot be read."""
    try:
        intent = pod_intent(response_json(api.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=timeout_s)))
    except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError):
        return False
    if intent.uid != uid or intent.node_name != node:
        return False
    cache.apply_pod_event("MODIFIED", intent)
    return True
