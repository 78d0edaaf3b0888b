"""Fenced binds: a compare-and-swap on a per-node claim ledger before every Binding.

With more than one gpufrac instance (``replicas: 2``, kube-scheduler's leader election),
two instances may bind at once for a moment: the old leader has not yet noticed that it lost
its Lease, or the new one decides from a cache that has not yet seen the old one's last
binds. Leader election alone cannot prevent that (a paused process keeps believing it
leads), so every bind is fenced by the API server's optimistic concurrency instead:

1. Each node has a ledger, a ConfigMap ``gpufrac-claims-<node>`` in gpufrac's namespace
   (label ``gpufrac.io/claims``), holding the claims of the last ``ttl_s`` seconds: pod UID,
   node, GPU UUIDs, share and memory, who claimed and when.
2. Before a bind, the instance counts every live claim of the node's ledger, as it last
   saw the ledger (``resourceVersion`` r), in its cache, in full, and chooses the GPUs and
   holds them, all under the cache's lock (``GpuCache.assume(..., claims=...)``), so the
   choice counts every allocation claimed up to r.
3. It writes the ledger with its claim added, on the precondition that the ledger is still
   at r (``replace`` with ``metadata.resourceVersion``; ``create`` when there is none yet).
   The API server answers 409 Conflict if any other write came in between: the bind is
   refused (kube-scheduler retries the pod), the hold given back, and the ledger read again.
4. Only after the claim is written does it create the Binding.

Of two instances deciding from the same ledger version, at most one commits; the other
was deciding without the first one's claim and is refused.

A claim is needed only until every instance's pod watch shows the pod bound. So a writer
also drops the claims whose pods its own pod watch already shows bound with those GPUs
(any owner's), and raises the ledger's **watermark** (``seenRV``, ``ClaimLedger.watermark``) to
the latest revision of the pod events that showed them bound. An instance may count on the
ledger, and commit to it, only once its own pod watch has applied events up to the
watermark (``extender.cluster.KubeBinder`` waits briefly, else the bind is refused and
retried): then each dropped claim's pod is in its cache, counted by the allocation the pod
carries. Revisions are etcd's, compared as integers (see
``_older``). The ledger so holds the binds in flight, not the last ``ttl_s`` of them: one
or two claims instead of every bind of the last minute. An allocation committed by a
claim is counted by every instance that commits later to the same node, whether or not its
Binding has landed yet (or ever lands: a claim expires after ``ttl_s``, by then the pod
watch shows the pod bound, or the bind failed). One extra write per bind, per node: binds to
different nodes never contend.

The ledger is in ``extender.cluster`` terms an API object like the others: plain JSON, read
by ``ClaimFence.observe`` from a watch, never trusted beyond its shape and bounds: a claim
holds at most ``MAX_GPUS_PER_NODE`` GPUs, a share of 0-1000 milli and at most
``MAX_GPU_MEMORY_MIB`` per GPU (the bounds of the ``assigned-*`` annotations), a ledger is
read up to ``MAX_LEDGER_BYTES`` and its newest ``MAX_CLAIMS`` claims; anything else is
skipped and named in ``ClaimLedger.problem`` (quarantined by the claims watch). A claim's
``at`` is written for people and never read as a time: its ``ttl_s`` runs from when this
instance first saw it, so neither a clock ahead nor a forged ``at`` can keep a claim alive
longer (after a restart a claim counts for at most one more ``ttl_s``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from extender.cache import ClaimedAllocation
from podspec.annotations import MAX_GPU_MEMORY_MIB, MAX_GPUS_PER_NODE
from podspec.kubeio import core_path, response_json, write_json

log = logging.getLogger(__name__)

CLAIMS_LABEL = "gpufrac.io/claims"
"""Label on every ledger ConfigMap (the claims watch selects on it)."""
NODE_ANNOTATION = "gpufrac.io/node"
"""The ledger's node, in full (the name may be shortened)."""
DATA_KEY = "claims.json"
WATERMARK_KEY = "seenRV"
"""Ledger data key: the pod-watch revision every committer must have reached (a decimal
integer; absent: 0)."""
MAX_WATERMARK_DIGITS = 20
MAX_CLAIMS = 512
"""At most this many claims kept per ledger, written or read (the newest); a node holds far
fewer pods."""
MAX_LEDGER_BYTES = 256 * 1024
"""Largest ``claims.json`` read (512 claims of 8 GPUs take about 150 KiB); a larger one is
read as empty and quarantined."""
MAX_FIELD_CHARS = 253
"""Longest name, UID or owner in a claim."""

MAX_SKEW_REPLICAS = 64
"""Instances whose clock skew is kept (``ClaimFence.skews``), however many owners claims forge."""
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class FenceConflict(Exception):
    """The ledger moved since this instance read it: another bind to the node came first."""


@dataclass(frozen=True, slots=True)
class Claim:
    """One committed allocation, as written in a node's ledger.

    The attributes are ``extender.cache.ClaimedAllocation``'s (the cache's view of a claim,
    ``counted``), with ``at_s`` for its ``ttl_s``: the wall-clock time of the claim,
    seconds since the epoch.
    """

    uid: str
    namespace: str
    name: str
    node: str
    gpu_uuids: tuple[str, ...]
    gpu_milli: int
    gpu_memory_mib: tuple[int, ...]
    owner: str
    at_s: float

    def counted(self, ttl_s: float) -> ClaimedAllocation:
        """The claim as the cache counts it, for the ``ttl_s`` seconds it has left
        (``ClaimFence.live``)."""
        return ClaimedAllocation(self.uid, self.namespace, self.name, self.node, self.gpu_uuids, self.gpu_milli,
                                 self.gpu_memory_mib, self.owner, ttl_s)

    def to_json(self) -> dict[str, Any]:
        """The claim as stored in the ledger."""
        return {"uid": self.uid, "namespace": self.namespace, "name": self.name, "node": self.node,
                "gpus": list(self.gpu_uuids), "milli": self.gpu_milli, "memoryMiB": list(self.gpu_memory_mib),
                "owner": self.owner, "at": self.at_s}

    @staticmethod
    def from_json(obj: Any) -> Claim:
        """Parse one stored claim.

        Raises
        ------
        ValueError
            When a field is missing or of the wrong type (the claim is skipped by the caller).
        """
        if not isinstance(obj, Mapping):
            raise ValueError("claim is not an object")
        try:
            if not isinstance(obj["gpus"], list) or not isinstance(obj["memoryMiB"], list):
                raise TypeError("gpus and memoryMiB must be lists")
            if not 1 <= len(obj["gpus"]) <= MAX_GPUS_PER_NODE:
                raise ValueError(f"gpus: {len(obj['gpus'])} entries, must be 1-{MAX_GPUS_PER_NODE}")
            texts = [obj[k] for k in ("uid", "namespace", "name", "node", "owner")]
            if not all(isinstance(t, str) and 0 < len(t) <= MAX_FIELD_CHARS for t in texts):
                raise ValueError(f"uid, namespace, name, node and owner: strings of 1-{MAX_FIELD_CHARS} characters")
            gpus = tuple(obj["gpus"])
            if not all(isinstance(g, str) and 0 < len(g) <= 128 for g in gpus):
                raise ValueError("gpus: UUIDs of 1-128 characters")
            if not all(_is_int(m) and 0 <= m <= MAX_GPU_MEMORY_MIB for m in obj["memoryMiB"]):
                raise ValueError(f"memoryMiB: integers in [0, {MAX_GPU_MEMORY_MIB}]")
            if not _is_int(obj["milli"]) or not 0 <= obj["milli"] <= 1000:
                raise ValueError("milli: an integer in [0, 1000]")
            at = obj["at"]
            if not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at):
                raise ValueError("at: a finite number")
            mem = tuple(int(m) for m in obj["memoryMiB"])
            uid, namespace, name, node, owner = texts
            claim = Claim(uid, namespace, name, node, gpus, int(obj["milli"]), mem, owner, float(at))
        except KeyError as exc:
            raise ValueError(f"bad claim: missing {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad claim: {exc}") from None
        if len(mem) != len(gpus):
            raise ValueError("bad claim: gpus and memoryMiB disagree")
        return claim


def _claim_key(c: Claim) -> tuple[Any, ...]:
    """What identifies one claim across rewrites of its ledger by other instances (who copy
    it as read); a new claim of the same pod by the same instance has a new ``at``."""
    return (c.uid, c.owner, c.at_s, c.gpu_uuids)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class ClaimLedger:
    """A node's ledger as last seen: its ``resourceVersion`` (None: not created yet) and the
    claims that passed the bounds (``ClaimFence.live`` says which still count)."""

    node: str
    resource_version: str | None
    claims: tuple[Claim, ...] = ()
    problem: str = ""
    """What was skipped on read (``""``: nothing), for the quarantine."""
    watermark: int = 0
    """The pod-watch revision a committer's own watch must have reached (see the module)."""


def default_instance_id() -> str:
    """``<hostname>-<8 random hex digits>``: unique per process, readable in the ledgers."""
    return f"{socket.gethostname()}-{secrets.token_hex(4)}"


def ledger_name(node: str) -> str:
    """The ConfigMap name of ``node``'s ledger: ``gpufrac-claims-<node>``, or a digest of the
    node name when that would not be a valid name (too long, or not a DNS subdomain)."""
    name = f"gpufrac-claims-{node}"
    if len(name) <= 253 and _DNS_SUBDOMAIN.match(node):
        return name
    return f"gpufrac-claims-{hashlib.sha256(node.encode()).hexdigest()[:32]}"


def parse_ledger(obj: Mapping[str, Any]) -> ClaimLedger | None:
    """A ledger from its ConfigMap JSON; None when it names no node. Malformed claims are
    skipped (logged), so one bad entry never hides the others."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return None
    annotations, data = meta.get("annotations"), obj.get("data")
    node = annotations.get(NODE_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(node, str) or not node:
        return None
    raw = data.get(DATA_KEY, "[]") if isinstance(data, Mapping) else "[]"
    rv = meta.get("resourceVersion")
    rv = rv if isinstance(rv, str) else None
    problems = []
    mark = data.get(WATERMARK_KEY, "0") if isinstance(data, Mapping) else "0"
    if isinstance(mark, str) and mark.isascii() and mark.isdigit() and len(mark) <= MAX_WATERMARK_DIGITS:
        watermark = int(mark)
    else:
        # Only gpufrac's account writes ledgers; an unreadable mark is read as none (and
        # quarantined): a committer then relies on its watch lagging less than ttl_s, as
        # the claims' own expiry does.
        watermark = 0
        problems.append(f"{WATERMARK_KEY}: not a decimal integer of at most {MAX_WATERMARK_DIGITS} digits")
    if isinstance(raw, str) and len(raw) > MAX_LEDGER_BYTES:
        problems.append(f"{DATA_KEY}: {len(raw)} characters, over {MAX_LEDGER_BYTES}; read as empty")
        return ClaimLedger(node, rv, (), "; ".join(problems), watermark)
    try:
        items = json.loads(raw) if isinstance(raw, str) else []
    except (ValueError, RecursionError):
        problems.append(f"{DATA_KEY}: not JSON; read as empty")
        return ClaimLedger(node, rv, (), "; ".join(problems), watermark)
    items = items if isinstance(items, list) else []
    if len(items) > MAX_CLAIMS:
        problems.append(f"{DATA_KEY}: {len(items)} claims, over {MAX_CLAIMS}; the newest {MAX_CLAIMS} read")
        items = items[-MAX_CLAIMS:]
    claims = []
    skipped = 0
    for item in items:
        try:
            claims.append(Claim.from_json(item))
        except ValueError as exc:
            skipped += 1
            if skipped == 1:
                problems.append(f"{DATA_KEY}[]: {exc}")
    if skipped > 1:
        problems.append(f"{skipped} claims skipped in all")
    return ClaimLedger(node, rv, tuple(claims), "; ".join(problems), watermark)


class ClaimFence:
    """Per-node claim ledgers in the API, written by compare-and-swap.

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    namespace : str
        Where the ledgers live (gpufrac's own namespace).
    identity : str
        This instance, written into its claims.
    ttl_s : float
        How long a claim counts (seconds) from when this instance first saw it; longer
        than a bind plus the pod watch's lag.
    clock, wall : callable returning float, optional
        This instance's monotonic clock (first sightings, from which every ``ttl_s`` runs: a
        wall clock stepped by NTP moves no TTL), and its wall clock (stamps ``at``, for people;
        the other instances' skew, ``skews``), seconds.
    api_timeout_s : float, optional
        Limit of each ledger read or write, seconds.
    """

    def __init__(self, api: client.CoreV1Api, namespace: str, identity: str, ttl_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, api_timeout_s: float = 4.0,
                 wall: Callable[[], float] = time.time) -> None:
        self._api = api
        self._timeout_s = api_timeout_s
        self.namespace = namespace
        self.identity = identity
        self.ttl_s = ttl_s
        self._clock = clock
        self._wall = wall
        self._ledgers: dict[str, ClaimLedger] = {}
        self._first_seen: dict[str, dict[tuple[Any, ...], float]] = {}
        self._skews: dict[str, float] = {}
        self._lock = threading.Lock()

    def now_s(self) -> float:
        """The fence's monotonic clock, seconds (claims' TTLs)."""
        return self._clock()

    def skews(self) -> dict[str, float]:
        """Each other instance's clock minus this one's, seconds: its newest claim's ``at`` minus
        this wall clock at first sight (less the write and watch delay)."""
        with self._lock:
            return dict(self._skews)

    def view(self, node: str) -> ClaimLedger:
        """The node's ledger as last seen (read from the API when never seen)."""
        with self._lock:
            got = self._ledgers.get(node)
        return got if got is not None else self.refresh(node)

    def refresh(self, node: str) -> ClaimLedger:
        """Read the node's ledger from the API (after a conflict, or the first time)."""
        try:
            obj = response_json(self._api.read_namespaced_config_map(
                ledger_name(node), self.namespace, _preload_content=False, _request_timeout=self._timeout_s))
            ledger = parse_ledger(obj) or ClaimLedger(node, None)
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
            ledger = ClaimLedger(node, None)
        return self._keep(ledger)

    def observe(self, kind: str, obj: Mapping[str, Any]) -> ClaimLedger | None:
        """Apply a watch or list event of a ledger ConfigMap; the ledger it shows now."""
        ledger = parse_ledger(obj)
        if ledger is None:
            return None
        if kind == "DELETED":
            ledger = ClaimLedger(ledger.node, None)
        return self._keep(ledger)

    def _keep(self, ledger: ClaimLedger) -> ClaimLedger:
        now = self.now_s()
        with self._lock:
            old = self._ledgers.get(ledger.node)
            # A watch event older than a write this instance made itself must not undo it.
            if old is not None and _older(ledger.resource_version, old.resource_version):
                return old
            self._ledgers[ledger.node] = ledger
            seen = self._first_seen.get(ledger.node, {})
            self._first_seen[ledger.node] = {k: seen.get(k, now) for k in map(_claim_key, ledger.claims)}
            for c in (c for c in ledger.claims if _claim_key(c) not in seen and c.owner != self.identity):
                if c.owner in self._skews or len(self._skews) < MAX_SKEW_REPLICAS:
                    self._skews[c.owner] = c.at_s - self._wall()
            return ledger

    def live(self, ledger: ClaimLedger) -> list[tuple[Claim, float]]:
        """The claims of ``ledger`` that still count, with the seconds each has left:
        ``ttl_s`` from when this instance first saw the claim (never from its ``at``)."""
        now = self.now_s()
        with self._lock:
            seen = self._first_seen.get(ledger.node, {})
            left = [(c, self.ttl_s - (now - seen.get(_claim_key(c), now))) for c in ledger.claims]
        return [(c, s) for c, s in left if s > 0]

    def commit(self, seen: ClaimLedger, claim: Claim,
               bound_rv: Callable[[Claim], int | None] | None = None) -> ClaimLedger:
        """``commit_all(seen, [claim], bound_rv)``."""
        return self.commit_all(seen, [claim], bound_rv)

    def commit_all(self, seen: ClaimLedger, new: Sequence[Claim],
                   bound_rv: Callable[[Claim], int | None] | None = None) -> ClaimLedger:
        """Write the claims ``new`` (all of one node) into its ledger, if the ledger is
        still ``seen``: one compare-and-swap for all of them.

        Claims past ``ttl_s`` (and beyond ``MAX_CLAIMS``, the oldest), this instance's
        earlier claim of the same pod, and the claims ``bound_rv`` says this instance's pod
        watch shows bound (the watermark raised to the latest of those revisions) are
        dropped in the same write.

        Parameters
        ----------
        seen : ClaimLedger
            The ledger the choice was made against (``view``), its watermark reached.
        new : sequence of Claim
            At least one; this instance's, all for ``seen.node``.
        bound_rv : callable, optional
            The revision of the pod event at which this instance's pod watch showed the
            claimed pod bound with the claimed GPUs, or None (keep the claim).

        Returns
        -------
        ClaimLedger
            The ledger as written.

        Raises
        ------
        FenceConflict
            The ledger changed since ``seen`` (409 Conflict, or it was created meanwhile);
            nothing was written. The fence has read it again.
        kubernetes.client.rest.ApiException
            Any other API failure.
        """
        # Another instance's claim of the same pod stays: when two schedulers bind one pod,
        # the API decides which Binding lands, and until then both must count.
        node = seen.node
        replaced = {(c.uid, c.owner) for c in new}
        keep = [c for c, _ in self.live(seen) if (c.uid, c.owner) not in replaced]
        watermark = seen.watermark
        if bound_rv is not None:
            marks = [bound_rv(c) for c in keep]
            watermark = max([watermark, *(m for m in marks if m is not None)])
            keep = [c for c, m in zip(keep, marks, strict=True) if m is None]
        claims = (*keep, *new)[-MAX_CLAIMS:]
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": ledger_name(node), "namespace": self.namespace,
                         "labels": {CLAIMS_LABEL: "true"}, "annotations": {NODE_ANNOTATION: node}},
            "data": {DATA_KEY: json.dumps([c.to_json() for c in claims], separators=(",", ":")),
                     WATERMARK_KEY: str(watermark)}}
        base = core_path("namespaces", self.namespace, "configmaps")
        try:
            if seen.resource_version is None:
                got = write_json(self._api, "POST", base, body, timeout_s=self._timeout_s)
            else:
                body["metadata"]["resourceVersion"] = seen.resource_version
                got = write_json(self._api, "PUT", f"{base}/{ledger_name(node)}", body,
                                 timeout_s=self._timeout_s)
        except ApiException as exc:
            # 409: replaced or created meanwhile; 404: deleted meanwhile (replace of a gone map)
            if exc.status == HTTP_CONFLICT or (exc.status == HTTP_NOT_FOUND and seen.resource_version is not None):
                self.refresh(node)
                raise FenceConflict(f"node {node}'s claim ledger moved past version "
                                    f"{seen.resource_version or '(none)'}") from None
            raise
        written = parse_ledger(got) or ClaimLedger(node, None, claims, watermark=watermark)
        return self._keep(written)

    def claim_of(self, uid: str, namespace: str, name: str, node: str, gpu_uuids: Iterable[str],
                 gpu_milli: int, gpu_memory_mib: Iterable[int]) -> Claim:
        """This instance's claim of an allocation, stamped now."""
        return Claim(uid, namespace, name, node, tuple(gpu_uuids), gpu_milli, tuple(gpu_memory_mib),
                     self.identity, self._wall())


def _older(a: str | None, b: str | None) -> bool:
    """True when resourceVersion ``a`` is known to be older than ``b``.

    Resource versions are opaque by contract, but the API server's are etcd revisions,
    which kube-apiserver itself compares as integers (``storage.APIObjectVersioner``); when
    either is not an integer nothing is assumed.
    """
    if a is None or b is None or not a.isdigit() or not b.isdigit():
        return False
    return int(a) < int(b)
