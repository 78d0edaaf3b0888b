"""Keep the node's ResourceSlice equal to the published inventory (``agent.dra.slice``).

Called after each inventory write (``Publisher.on_publish``, so a health change reaches the
slice as fast as the annotation). Writes only when the devices changed since the last write
this process made, or once at start: the API server rewrites quantities in its own canonical
form, so the slice read back is not compared with the one built. kubelet deletes a node's
slices when it starts and a driver's when the driver leaves (``DRAPluginManager``), so the
slice is also written again when the kubelet plugin registers (``invalidate``) and whenever a
check, at most every ``recheck_s``, finds it gone. A change replaces the slice
with the pool's generation + 1 (read from the server, with its resourceVersion: a write that
lost a race is refused with 409 and made again on the next call). The API is called with
bounded timeouts; errors are logged and retried on the next inventory write, never raised
into the publisher's loop.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import urllib3
from kubernetes.client import CustomObjectsApi
from kubernetes.client.rest import ApiException

from agent.dra.slice import devices, resource_slice, slice_name
from podspec.annotations import NodeInventory
from podspec.kubeio import response_json

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceslices"

TIMEOUT_S = (3.0, 10.0)
"""Connect and read timeouts of each API call, seconds."""


class SlicePublisher:
    """Writes ``node``'s ResourceSlice when its devices change.

    Parameters
    ----------
    core_api : kubernetes.client.CoreV1Api
        The agent's (its ``api_client`` is shared; the Node is read for its UID).
    node : str
        This node's name.
    """

    def __init__(self, core_api: Any, node: str, recheck_s: float = 60.0) -> None:
        self._core = core_api
        self._api = CustomObjectsApi(core_api.api_client)
        self.node = node
        self.recheck_s = recheck_s
        self._lock = threading.Lock()  # the publisher's thread and the kubelet plugin's both call
        self._written: list[dict[str, Any]] | None = None
        self._checked_s = time.monotonic()
        self.writes = 0
        """Slices created or replaced by this process."""

    def invalidate(self) -> None:
        """Write the slice on the next ``publish`` even if its devices did not change."""
        with self._lock:
            self._written = None

    def publish(self, inventory: NodeInventory | None) -> bool:
        """Make the slice hold ``inventory``'s healthy GPUs; True if it was written.

        Never raises: an API error is logged and the next call tries again.
        """
        if inventory is None:
            return False
        wanted = devices(inventory)
        with self._lock:
            try:
                if wanted == self._written and not self._gone():
                    return False
                self._write(inventory)
            except ApiException as exc:
                log.warning("ResourceSlice %s not written (%s %s); retried on the next inventory write",
                            slice_name(self.node), exc.status, exc.reason)
                return False
            except (OSError, urllib3.exceptions.HTTPError, ValueError, KeyError, TypeError) as exc:
                # The API server unreachable, or an answer that is not the object asked: never out of here
                # (the publisher's thread calls this after every inventory write).
                log.warning("ResourceSlice %s not written (%s: %s); retried on the next inventory write",
                            slice_name(self.node), type(exc).__name__, exc)
                return False
            self._written = wanted
            self._checked_s = time.monotonic()
            self.writes += 1
            return True

    def _gone(self) -> bool:
        """Whether the slice was deleted behind this process (read at most every ``recheck_s``)."""
        if time.monotonic() - self._checked_s < self.recheck_s:
            return False
        self._checked_s = time.monotonic()
        try:
            self._api.get_cluster_custom_object(GROUP, VERSION, PLURAL, slice_name(self.node),
                                                _preload_content=False, _request_timeout=TIMEOUT_S).release_conn()
        except ApiException as exc:
            if exc.status == 404:
                log.info("ResourceSlice %s is gone (kubelet removes a node's slices when it starts); "
                         "writing it again", slice_name(self.node))
                return True
            raise
        return False

    def _write(self, inventory: NodeInventory) -> None:
        name = slice_name(self.node)
        node_uid = response_json(self._core.read_node(self.node, _preload_content=False,
                                                      _request_timeout=TIMEOUT_S))["metadata"]["uid"]
        try:
            current = response_json(self._api.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, _preload_content=False, _request_timeout=TIMEOUT_S))
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._api.create_cluster_custom_object(GROUP, VERSION, PLURAL, resource_slice(inventory, 0, node_uid),
                                                   _request_timeout=TIMEOUT_S)
            log.info("ResourceSlice %s created: %d GPU(s)", name, len(devices(inventory)))
            return
        generation = int(((current.get("spec") or {}).get("pool") or {}).get("generation") or 0) + 1
        body = resource_slice(inventory, generation, node_uid)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self._api.replace_cluster_custom_object(GROUP, VERSION, PLURAL, name, body, _request_timeout=TIMEOUT_S)
        log.info("ResourceSlice %s replaced: %d GPU(s), pool generation %d", name, len(body["spec"]["devices"]),
                 generation)
