"""Cluster mode: the Kubernetes API side of the extender (``sync``, ``nodes``, ``binder``, ``objects``).

``ClusterSync`` feeds the cache from the API: list-then-watch on Nodes, on Pods and on
Namespaces (their labels, for the admin config's ``tenant_label``) (from the
list's ``resourceVersion``, with bookmarks; a new list on ``410 Gone``; bounded exponential
backoff on any other error), plus a housekeeping loop that marks nodes whose inventory
heartbeat went stale and frees assumed allocations that were never confirmed.

``KubeBinder`` is the cluster-mode bind: hold the allocation as assumed in the cache (the fit
re-checked under the cache lock), then create the Binding carrying the allocation record as
annotations, which the API server writes onto the pod together with ``spec.nodeName``. If
the call fails the assumed allocation is given back and the error goes to kube-scheduler.
With a ``ClaimFence`` (``--fence-namespace``, for more than one replica) the allocation is
first claimed on the node's ledger by compare-and-swap (``extender.fence``), and a claims
watch counts other replicas' claims as they are written.

Every object is handled as plain API JSON (``_preload_content=False``; watch events not
deserialized, see ``raw_watch_target``): ``podspec`` parses it, as it parses the
Pod inside an extender request.
"""

from extender.cluster.binder import KubeBinder
from extender.cluster.objects import SyncOptions, raw_watch_target
from extender.cluster.sync import ClusterSync

__all__ = ["ClusterSync", "KubeBinder", "SyncOptions", "raw_watch_target"]
