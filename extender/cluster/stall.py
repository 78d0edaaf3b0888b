"""``StallWatch``: GPU pods of gpufrac's profile that no scheduler has attempted, and why.

gpufrac sees only the calls kube-scheduler makes; when kube-scheduler makes none (its
leader-election Lease held by someone else, a scheduler that never became leader, one that
does not reach gpufrac), nothing fails and nothing says so. This loop looks from the other
side: every ``poll_s`` it lists the pending pods of the profile (``spec.schedulerName``,
``spec.nodeName`` empty; at most ``MAX_PENDING_LISTED``) and counts those that ask for
``gpufrac.io/gpu`` and carry no ``PodScheduled`` condition, which kube-scheduler writes on
its first attempt (``Unschedulable`` when it fails, ``True`` with the binding). A pod still
in that state ``after_s`` after this process first saw it is *not attempted*. The time is
this process's monotonic clock (the API server's ``creationTimestamp`` is another machine's
clock; issue 52). Not seen: a pod attempted once before the scheduler stalled keeps its
condition; new pods show the stall.

The cause it can see is the Lease kube-scheduler elects its leader with: its holder, how long
ago this process saw its ``renewTime`` change, and whether the holder is one of the release's
kube-scheduler pods (kube-scheduler's identity is ``<hostname>_<uuid>``; a pod's hostname is
its name). Each pass is published as one immutable ``StallReport`` (``/readyz`` detail, the
metrics); the first report of a stall, a change of its cause and its end are logged; each
not-attempted pod gets one Warning Event ``SchedulingNotAttempted`` naming the cause (its name
is derived from the pod's UID, so replicas do not repeat it). Every API call has a timeout;
a call that fails is reported as such, never raised out of the loop.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from podspec import annotations as ann
from podspec.kubeio import response_json

log = logging.getLogger(__name__)

MAX_PENDING_LISTED = 500
"""Pending pods of the profile read per pass (one page): a stall shows in the first ones."""

MAX_EVENTS_PER_PASS = 20
"""Events written per pass at most (the rest on later passes)."""

MAX_NAME_CHARS = 253
"""Longest holder identity or object name kept (the API's own limit for names)."""

EVENT_REASON = "SchedulingNotAttempted"


@dataclass(frozen=True)
class StallOptions:
    """What ``StallWatch`` looks at; seconds.

    Attributes
    ----------
    scheduler_name : str
        The kube-scheduler profile that calls this extender.
    after_s : float
        A pending GPU pod of the profile with no ``PodScheduled`` condition this long after
        this process first saw it is reported.
    lease : tuple of (str, str) or None
        ``(namespace, name)`` of the Lease the profile's kube-scheduler elects its leader
        with; None: no Lease is read (leader election off).
    scheduler_pod_selector : str or None
        Label selector of the release's kube-scheduler pods in the Lease's namespace: whether
        the holder is one of them. None: not judged.
    poll_s : float
        Period of a pass.
    api_timeout_s : float
        Limit of each API call.
    """

    scheduler_name: str = "gpufrac-scheduler"
    after_s: float = 30.0
    lease: tuple[str, str] | None = None
    scheduler_pod_selector: str | None = None
    poll_s: float = 5.0
    api_timeout_s: float = 5.0


@dataclass(frozen=True)
class LeaseState:
    """The scheduler's Lease as this process last read it.

    Attributes
    ----------
    namespace, name : str
    found : bool
        False: the Lease does not exist (no scheduler has been elected) or could not be read.
    holder : str
        ``spec.holderIdentity`` ("" when none).
    renew_age_s : float or None
        Seconds since this process saw ``spec.renewTime`` change (its first reading counts as
        a change); None when the Lease has no renewTime.
    duration_s : int or None
        ``spec.leaseDurationSeconds`` as written.
    holder_in_release : bool or None
        Whether the holder is one of the release's kube-scheduler pods; None when not judged.
    error : str
        Why the Lease or the release's pods could not be read ("" when they could).
    """

    namespace: str
    name: str
    found: bool = False
    holder: str = ""
    renew_age_s: float | None = None
    duration_s: int | None = None
    holder_in_release: bool | None = None
    error: str = ""

    def cause(self) -> str:
        """The sentence an Event, the log and ``/readyz`` give for a stall."""
        where = f"Lease {self.namespace}/{self.name}"
        if self.error:
            return f"{where}: {self.error}"
        if not self.found:
            return f"{where} does not exist: no kube-scheduler of the profile has been elected leader"
        if not self.holder:
            return f"{where} has no holder: no kube-scheduler of the profile leads"
        whose = {True: "one of this release's kube-scheduler pods", False: "not a kube-scheduler pod of this release",
                 None: "not checked against the release's pods"}[self.holder_in_release]
        age = "" if self.renew_age_s is None else f", renewed {self.renew_age_s:.0f} s ago as seen here"
        duration = "" if self.duration_s is None else f", leaseDurationSeconds {self.duration_s}"
        return f"{where} is held by {self.holder!r} ({whose}{age}{duration})"

    def identity(self) -> str:
        """The cause without the ages that change every pass: what the log and the Events
        repeat only when it changes."""
        return repr((self.found, self.holder, self.holder_in_release, self.error))

    def as_dict(self) -> dict[str, Any]:
        """JSON for ``/readyz``."""
        return {"lease": f"{self.namespace}/{self.name}", "found": self.found, "holder": self.holder,
                "renew_age_s": None if self.renew_age_s is None else round(self.renew_age_s, 1),
                "lease_duration_s": self.duration_s, "holder_in_release": self.holder_in_release,
                "error": self.error}


@dataclass(frozen=True)
class StallReport:
    """One pass of ``StallWatch``.

    Attributes
    ----------
    pods : tuple of str
        ``namespace/name`` of the pods not attempted for ``after_s`` or more, longest first.
    oldest_s : float
        Seconds the longest of them has waited since this process first saw it (0 when none).
    lease : LeaseState or None
    error : str
        Why the pending pods could not be listed ("" when they could).
    """

    pods: tuple[str, ...] = ()
    oldest_s: float = 0.0
    lease: LeaseState | None = None
    error: str = ""

    @property
    def stalled(self) -> bool:
        """True when some GPU pod of the profile waits unattempted."""
        return bool(self.pods)

    def cause(self) -> str:
        """What is known of why (the Lease), or that the Lease is not read."""
        if self.lease is None:
            return "the scheduler's Lease is not read (--scheduler-lease unset)"
        return self.lease.cause()

    def cause_identity(self) -> str:
        """``LeaseState.identity`` ("" when nothing waits)."""
        if not self.stalled:
            return ""
        return "no lease" if self.lease is None else self.lease.identity()

    def as_dict(self) -> dict[str, Any]:
        """JSON for ``/readyz``'s ``scheduler`` detail."""
        return {"pods_not_attempted": len(self.pods), "oldest_s": round(self.oldest_s, 1),
                "examples": list(self.pods[:5]), "cause": self.cause() if self.stalled else "",
                "lease": None if self.lease is None else self.lease.as_dict(), "error": self.error}


def asks_for_gpu(pod: Mapping[str, Any]) -> bool:
    """True when some container limits ``gpufrac.io/gpu`` to a positive number (lenient:
    anything unreadable counts as no)."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list):
        return False
    for c in containers[:64]:
        limits = ((c.get("resources") or {}).get("limits") or {}) if isinstance(c, Mapping) else {}
        raw = limits.get(ann.RESOURCE_GPU) if isinstance(limits, Mapping) else None
        if isinstance(raw, str | int) and str(raw).isdigit() and int(str(raw)) > 0:
            return True
    return False


def attempted(pod: Mapping[str, Any]) -> bool:
    """True when the pod carries a ``PodScheduled`` condition (any status): some scheduler
    has tried it. Unreadable conditions count as attempted (never a false alarm)."""
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if conditions is None:
        return False
    if not isinstance(conditions, list):
        return True
    return any(not isinstance(c, Mapping) or c.get("type") == "PodScheduled" for c in conditions[:64])


def _meta(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    uid, ns, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
    if not all(isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS for v in (uid, ns, name)):
        return None
    return uid, ns, name  # type: ignore[return-value]  # checked above


def _api_error(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"[:200]


@dataclass
class _Seen:
    """What a pass carries to the next: when each pod was first seen unattempted, which pods
    got an Event, the Lease's last renewTime and when it changed."""

    first_seen: dict[str, float] = field(default_factory=dict)
    told: dict[str, str] = field(default_factory=dict)  # uid -> identity of the cause an Event named
    renew: tuple[str, float] | None = None
    cause: str = ""


class StallWatch:
    """Find GPU pods of the profile no scheduler has attempted, and say why (module notes).

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    options : StallOptions
    monotonic : callable returning seconds, optional
        This process's clock (injected by tests).
    leases : kubernetes.client.CoordinationV1Api, optional
        Where the Lease is read; by default on ``api``'s connection (injected by tests).
    """

    def __init__(self, api: client.CoreV1Api, options: StallOptions,
                 monotonic: Callable[[], float] = time.monotonic, leases: Any = None) -> None:
        self._api = api
        self._leases = leases if leases is not None else client.CoordinationV1Api(api.api_client)
        self._opts = options
        self._monotonic = monotonic
        self._seen = _Seen()
        self.report = StallReport()
        """The last pass's report (replaced whole: read without a lock)."""

    def loop(self, stop: threading.Event) -> None:
        """A pass every ``poll_s`` until ``stop``; a pass that raises is logged, never fatal."""
        while not stop.wait(self._opts.poll_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - never let the loop die
                log.exception("scheduler stall check failed")

    def check(self) -> StallReport:
        """One pass: list, judge, read the Lease (every pass, so that its renewals are seen
        changing), tell (module notes)."""
        opts, now = self._opts, self._monotonic()
        try:
            pending = self._pending()
        except Exception as exc:  # noqa: BLE001 - the API is a neighbour: report, retry next pass
            self.report = StallReport(error=f"cannot list the pending pods of {opts.scheduler_name}: "
                                            f"{_api_error(exc)}", lease=self.report.lease)
            return self.report
        first = self._seen.first_seen
        self._seen.first_seen = {uid: first.get(uid, now) for uid in pending}
        self._seen.told = {uid: c for uid, c in self._seen.told.items() if uid in pending}
        late = sorted(((now - t, pending[uid], uid) for uid, t in self._seen.first_seen.items()
                       if now - t >= opts.after_s), key=lambda item: (-item[0], item[1]))
        lease = self._lease(now) if opts.lease is not None else None
        report = StallReport(tuple(key for _, key, _ in late), late[0][0] if late else 0.0, lease)
        self._tell(report, [(uid, key) for _, key, uid in late])
        self.report = report
        return report

    def _pending(self) -> dict[str, str]:
        """UID -> namespace/name of the pending GPU pods of the profile with no attempt."""
        opts = self._opts
        data = response_json(self._api.list_pod_for_all_namespaces(
            field_selector=f"spec.schedulerName={opts.scheduler_name},spec.nodeName=,status.phase=Pending",
            limit=MAX_PENDING_LISTED, _request_timeout=opts.api_timeout_s, _preload_content=False))
        out: dict[str, str] = {}
        items = data.get("items") if isinstance(data, Mapping) else None
        for pod in (items if isinstance(items, list) else [])[:MAX_PENDING_LISTED]:
            if not isinstance(pod, Mapping) or not asks_for_gpu(pod) or attempted(pod):
                continue
            meta = _meta(pod)
            deleting = isinstance(pod.get("metadata"), Mapping) and pod["metadata"].get("deletionTimestamp")
            if meta is not None and not deleting:
                out[meta[0]] = f"{meta[1]}/{meta[2]}"
        return out

    def _lease(self, now: float) -> LeaseState:
        """Read the Lease (and, with a selector, the release's scheduler pods)."""
        assert self._opts.lease is not None
        ns, name = self._opts.lease
        timeout = self._opts.api_timeout_s
        try:
            raw = response_json(self._leases.read_namespaced_lease(name, ns, _request_timeout=timeout,
                                                                   _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return LeaseState(ns, name)
            return LeaseState(ns, name, error=f"cannot be read: {_api_error(exc)}")
        except Exception as exc:  # noqa: BLE001 - network: report
            return LeaseState(ns, name, error=f"cannot be read: {_api_error(exc)}")
        spec = raw.get("spec") if isinstance(raw, Mapping) else None
        spec = spec if isinstance(spec, Mapping) else {}
        holder = spec.get("holderIdentity")
        holder = holder[:MAX_NAME_CHARS] if isinstance(holder, str) else ""
        duration = spec.get("leaseDurationSeconds")
        duration = duration if isinstance(duration, int) and not isinstance(duration, bool) else None
        renewed = spec.get("renewTime")
        age: float | None = None
        if isinstance(renewed, str):
            if self._seen.renew is None or self._seen.renew[0] != renewed:
                self._seen.renew = (renewed, now)
            age = now - self._seen.renew[1]
        in_release, error = self._holder_in_release(ns, holder)
        return LeaseState(ns, name, True, holder, age, duration, in_release, error)

    def _holder_in_release(self, ns: str, holder: str) -> tuple[bool | None, str]:
        selector = self._opts.scheduler_pod_selector
        if selector is None or not holder:
            return None, ""
        try:
            data = response_json(self._api.list_namespaced_pod(ns, label_selector=selector, limit=100,
                                                               _request_timeout=self._opts.api_timeout_s,
                                                               _preload_content=False))
        except Exception as exc:  # noqa: BLE001 - report, judge nothing
            return None, f"the release's kube-scheduler pods cannot be listed: {_api_error(exc)}"
        names = {m[2] for pod in data.get("items") or [] if isinstance(pod, Mapping) and (m := _meta(pod))}
        return holder.split("_", 1)[0] in names, ""

    def _tell(self, report: StallReport, late: list[tuple[str, str]]) -> None:
        """Log a stall's start, change of cause and end; one Event per pod and cause."""
        cause, identity = (report.cause(), report.cause_identity()) if report.stalled else ("", "")
        if identity != self._seen.cause:
            if identity:
                log.warning("%d GPU pod(s) of %s not attempted by any scheduler for %.0f s or more (%s); %s",
                            len(report.pods), self._opts.scheduler_name, self._opts.after_s,
                            ", ".join(report.pods[:3]), cause)
            else:
                log.warning("GPU pods of %s are attempted again", self._opts.scheduler_name)
            self._seen.cause = identity
        budget = MAX_EVENTS_PER_PASS
        for uid, key in late:
            if budget <= 0:
                break
            if self._seen.told.get(uid) == identity:
                continue
            budget -= 1
            if self._event(uid, key, cause, identity):
                self._seen.told[uid] = identity

    def _event(self, uid: str, key: str, cause: str, identity: str) -> bool:
        """Write the Warning Event on the pod; True when written or already there (its name
        is the pod's and a checksum of its UID and the cause's identity: the same on every
        replica)."""
        ns, name = key.split("/", 1)
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = (f"gpufrac: no scheduler has attempted this pod for {self._opts.after_s:.0f} s or more "
                   f"(schedulerName {self._opts.scheduler_name}); {cause}")[:1024]
        body = {"metadata": {"name": f"{name[:200].rstrip('.-')}.{zlib.crc32((uid + identity).encode()):08x}", "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": name, "uid": uid},
                "reason": EVENT_REASON, "message": message, "type": "Warning", "count": 1,
                "firstTimestamp": stamp, "lastTimestamp": stamp, "source": {"component": "gpufrac-extender"},
                "reportingComponent": "gpufrac-extender"}
        try:
            self._api.create_namespaced_event(ns, body, _request_timeout=self._opts.api_timeout_s,
                                              _preload_content=False)
        except ApiException as exc:
            if exc.status == 409:
                return True  # another replica told it
            log.info("event on %s not written: %s", key, _api_error(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - report, retry next pass
            log.info("event on %s not written: %s", key, _api_error(exc))
            return False
        return True
