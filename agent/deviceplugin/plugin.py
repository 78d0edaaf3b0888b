"""The ``gpufrac.io/gpu`` device plugin: kubelet's device-plugin API v1beta1 over gRPC.

Devices are time-slicing replica slots: GPU ``uuid`` with ``replicas`` slots is advertised as
IDs ``<uuid>::0`` ... ``<uuid>::<replicas-1>`` with the GPU's health, so the node's
``gpufrac.io/gpu`` allocatable is its slot count, as the extender expects. Which GPU a
container really gets is gpufrac's allocation record on its pod (``assign``); the slot IDs
kubelet picks are bookkeeping, steered by ``GetPreferredAllocation`` to slots of the GPUs
that record names.

``PluginServer`` serves on a unix socket in kubelet's device-plugin directory, registers with
``kubelet.sock``, and registers again when kubelet restarts (kubelet recreates its socket and
removes plugin sockets, so the server is restarted too).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.deviceplugin import assign
from agent.deviceplugin.stubs import load
from podspec import annotations as ann

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
SOCKET_NAME = "gpufrac.sock"


@dataclass(frozen=True, slots=True)
class GpuSlots:
    """One GPU as the plugin advertises it."""

    uuid: str
    replicas: int
    healthy: bool


def slots_of(inventory: Any) -> list[GpuSlots]:
    """Advertised GPUs from a ``NodeInventory`` (None before the first reading: none)."""
    if inventory is None:
        return []
    return [GpuSlots(g.uuid, g.replicas, g.healthy) for g in inventory.gpus]


def slot_ids(gpus: Sequence[GpuSlots]) -> list[tuple[str, bool]]:
    """``(device ID, healthy)`` for every replica slot, GPU by GPU."""
    return [(f"{g.uuid}::{i}", g.healthy) for g in gpus for i in range(g.replicas)]


def gpu_of(device_id: str) -> str:
    """The GPU UUID of a slot ID."""
    return device_id.rsplit("::", 1)[0]


MAX_DEVICE_ID_CHARS = 160
"""Longest device ID a call may name: the plugin's IDs are ``<uuid>::<slot>`` (an NVML UUID is
40 characters, a MIG device's about 60); anything longer was never advertised."""

WORKERS = 16
"""gRPC worker threads: a ListAndWatch stream holds one while open (only the newest stream stays
open), the unary calls share the rest."""


class InvalidCall(Exception):
    """A call naming devices the plugin never advertised, twice, or too many; kubelet gets
    ``INVALID_ARGUMENT`` with this message."""


def _quote(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def check_ids(ids: Sequence[str], advertised: frozenset[str], field: str, *, empty_ok: bool = False) -> None:
    """Every ID of ``ids`` advertised, none twice, no more than were advertised.

    Raises
    ------
    InvalidCall
        Naming the field and the first bad ID.
    """
    if not ids and not empty_ok:
        raise InvalidCall(f"{field}: empty")
    if len(ids) > len(advertised):
        raise InvalidCall(f"{field}: {len(ids)} device IDs, more than the {len(advertised)} this plugin advertised")
    seen: set[str] = set()
    for i, d in enumerate(ids):
        if len(d) > MAX_DEVICE_ID_CHARS:
            raise InvalidCall(f"{field}[{i}]: a device ID of {len(d)} characters (at most {MAX_DEVICE_ID_CHARS})")
        if d not in advertised:
            raise InvalidCall(f"{field}[{i}]: {_quote(d)} was never advertised by this plugin")
        if d in seen:
            raise InvalidCall(f"{field}[{i}]: {_quote(d)} appears twice")
        seen.add(d)


def preferred(available: Sequence[str], must_include: Sequence[str], size: int,
              want: set[str]) -> list[str]:
    """``GetPreferredAllocation`` for one container, in linear time: ``must_include``, then one
    slot of each GPU of ``want`` (the pod's record) not yet used, then any slots."""
    chosen = list(must_include)
    taken = set(chosen)
    used = {gpu_of(d) for d in chosen}
    for d in available:
        if len(chosen) >= size:
            break
        g = gpu_of(d)
        if d not in taken and g in want and g not in used:
            chosen.append(d)
            taken.add(d)
            used.add(g)
    for d in available:  # no record: any slots, kubelet decides
        if len(chosen) >= size:
            break
        if d not in taken:
            chosen.append(d)
            taken.add(d)
    return chosen


class PodReader:
    """The node's pods as the calls read them: one read serves the calls of ``ttl_s``; a call that
    finds no pod for it asks for a read made after it began (the pod kubelet admits may be newer
    than the last read), and such reads are at least ``refresh_s`` apart: a call waits for the
    next one rather than reading at once, and calls that miss together share it.

    Parameters
    ----------
    read : callable
        The node's Pod objects (the agent's LIST, which carries its own timeout).
    ttl_s, refresh_s : float
    clock, sleep : callable
        Seconds, monotonic; and a sleep (injected in tests).
    """

    def __init__(self, read: Callable[[], Sequence[Mapping[str, Any]]], ttl_s: float = 2.0,
                 refresh_s: float = 0.05, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        self._read, self._ttl_s, self._refresh_s = read, ttl_s, refresh_s
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._pods: Sequence[Mapping[str, Any]] = ()
        self._at = -float("inf")

    def get(self, since: float | None = None) -> Sequence[Mapping[str, Any]]:
        """The pods; with ``since`` (when the asking call began), from a read made at or after it."""
        while True:
            with self._lock:
                now = self._clock()
                if since is None and now - self._at < self._ttl_s or since is not None and self._at >= since:
                    return self._pods
                wait = self._at + self._refresh_s - now
                if since is None or wait <= 0:
                    self._pods = list(self._read())
                    self._at = self._clock()
                    return self._pods
            self._sleep(wait)  # outside the lock: calls the cache serves are not held up


def make_servicer(gpus: Callable[[], Sequence[GpuSlots]], pods: Callable[[], Sequence[Mapping[str, Any]]],
                  node: str, changed: threading.Event, stop: threading.Event,
                  mps_pipe_dir: str | None = None, on_allocate: Callable[[str], object] = lambda result: None,
                  matcher: assign.Matcher | None = None) -> Any:
    """The DevicePlugin servicer (a class built on the generated base, which is loaded lazily).

    Every call is checked against the devices advertised (``check_ids``: unknown, duplicated,
    empty or too many IDs get ``INVALID_ARGUMENT`` naming the first bad one); ``Allocate`` is
    all or nothing (``Matcher.take_all``); ``GetPreferredAllocation`` is linear and reads the
    matcher's state under the lock only to copy it; the pods are read outside that lock
    (``PodReader``); only the newest ``ListAndWatch`` stream stays open (a new one ends the
    one before: kubelet opens one per registration), so unary calls always find a worker.

    Parameters
    ----------
    gpus : callable
        Current GPUs with health (from the agent's NVML reading).
    pods : callable
        Current Pod objects (API JSON) on this node, for the allocation records.
    node : str
    changed : threading.Event
        Set when health or slots may have changed: ListAndWatch sends a new list.
    stop : threading.Event
        Ends ListAndWatch streams.
    mps_pipe_dir : str, optional
        The node's MPS control daemon pipe directory (host path): mounted into containers
        below a whole GPU (``assign.container_mps``).
    on_allocate : callable, optional
        Called once per Allocate with its result (``"ok"`` per container, ``"no_pod"``, ``"invalid"``).
    matcher : assign.Matcher, optional
        The containers allocated so far. A server started again (kubelet restarted, the plugin
        registers anew) must be given the one before it had: a pod admitted before the restart
        whose containers have not started is still a candidate, and a fresh matcher would hand
        its record to the next pod's Allocate (a GPU the pod was not given). Its calls are
        serialised by the matcher's own lock.
    """
    pb, pb_grpc = load()
    allocated = matcher if matcher is not None else assign.Matcher()
    lock = allocated.lock
    reader = PodReader(pods)
    newest: list[threading.Event] = [threading.Event()]
    streams = threading.Lock()

    def advertised() -> frozenset[str]:
        return frozenset(i for i, _ in slot_ids(gpus()))

    def candidates(since: float | None, context: Any) -> list[assign.PodAssignment]:
        try:
            return assign.candidates(reader.get(since), node)
        except Exception as exc:  # noqa: BLE001 - the API is a neighbour: say so, do not crash
            log.warning("reading the pods of %s failed: %s", node, exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"gpufrac: cannot read the pods of {node}: {exc}")
            raise RuntimeError("grpc context.abort returned") from exc  # it raises

    def invalid(context: Any, exc: InvalidCall) -> None:
        log.warning("refused a device-plugin call: %s", exc)
        on_allocate("invalid")
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"gpufrac: {exc}")

    # The servicer base comes from the stubs generated at run time (stubs.load()): untyped.
    class Servicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc,name-defined]
        def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
            return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

        def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
            mine = threading.Event()
            with streams:
                newest[0].set()  # the stream before this one ends
                newest[0] = mine
            changed.set()
            last: list[tuple[str, bool]] | None = None
            while not stop.is_set() and not mine.is_set() and context.is_active():
                current = slot_ids(gpus())
                if current != last:
                    log.info("ListAndWatch: %d devices sent to kubelet, %d healthy",
                             len(current), sum(ok for _, ok in current))
                    yield pb.ListAndWatchResponse(devices=[
                        pb.Device(ID=i, health="Healthy" if ok else "Unhealthy") for i, ok in current])
                    last = current
                changed.wait(1.0)
                changed.clear()

        def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
            ads = advertised()
            try:
                if len(request.container_requests) > len(ads):
                    raise InvalidCall(f"{len(request.container_requests)} container requests, more than the "
                                      f"{len(ads)} devices advertised")
                for c, creq in enumerate(request.container_requests):
                    where = f"container_requests[{c}]"
                    check_ids(creq.available_deviceIDs, ads, f"{where}.available_deviceIDs")
                    check_ids(creq.must_include_deviceIDs, ads, f"{where}.must_include_deviceIDs", empty_ok=True)
                    missing = set(creq.must_include_deviceIDs) - set(creq.available_deviceIDs)
                    if missing:
                        raise InvalidCall(f"{where}.must_include_deviceIDs: {_quote(sorted(missing)[0])} "
                                          "is not among available_deviceIDs")
                    if not len(creq.must_include_deviceIDs) <= creq.allocation_size <= len(creq.available_deviceIDs):
                        raise InvalidCall(f"{where}.allocation_size: {creq.allocation_size} is not between "
                                          f"{len(creq.must_include_deviceIDs)} (must_include) and "
                                          f"{len(creq.available_deviceIDs)} (available)")
            except InvalidCall as exc:
                invalid(context, exc)
                raise RuntimeError("grpc context.abort returned") from exc  # it raises
            cands = candidates(None, context)
            with lock:
                done = allocated.snapshot()
            out = []
            for creq in request.container_requests:
                found = assign.pick(creq.allocation_size, cands, done)
                want = set(found[0].slice_for(found[1])[0]) if found else set()
                out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=preferred(
                    creq.available_deviceIDs, creq.must_include_deviceIDs, creq.allocation_size, want)))
            return pb.PreferredAllocationResponse(container_responses=out)

        def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
            ads = advertised()
            try:
                if not request.container_requests:
                    raise InvalidCall("container_requests: empty")
                every: list[str] = []
                for c, creq in enumerate(request.container_requests):
                    check_ids(creq.devices_ids, ads, f"container_requests[{c}].devices_ids")
                    every.extend(creq.devices_ids)
                    if len(every) > len(ads):
                        raise InvalidCall(f"{len(every)} devices asked in one call, more than the {len(ads)} advertised")
                check_ids(every, ads, "devices_ids (all containers)")
            except InvalidCall as exc:
                invalid(context, exc)
                raise RuntimeError("grpc context.abort returned") from exc  # it raises
            sizes = [len(creq.devices_ids) for creq in request.container_requests]
            found = None
            began = time.monotonic()
            for since in (None, began):  # the cached read first; the pod may be newer than it
                cands = candidates(since, context)
                with lock:
                    found = allocated.take_all(sizes, cands)
                if found is not None:
                    break
            if found is None:
                on_allocate("no_pod")
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"gpufrac: no pod on {node} bound by gpufrac waits for "
                              f"{', '.join(map(str, sizes))} {ann.RESOURCE_GPU} (is the pod using schedulerName "
                              "gpufrac-scheduler?); nothing was allocated")
                raise RuntimeError("grpc context.abort returned")  # it raises
            responses = []
            for pod, index in found:
                uuids, memory = pod.slice_for(index)
                log.info("allocate %s container #%d: %s", pod.key, index, ",".join(uuids))
                on_allocate("ok")
                mps_env, mps_mounts = assign.container_mps(pod.gpu_milli, mps_pipe_dir)
                responses.append(pb.ContainerAllocateResponse(
                    envs={**assign.container_env(uuids, pod.gpu_milli, memory), **mps_env},
                    mounts=[pb.Mount(container_path=c, host_path=h, read_only=False) for c, h in mps_mounts],
                    annotations={ann.ASSIGNED_GPUS: ",".join(uuids)}))
            return pb.AllocateResponse(container_responses=responses)

        def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.PreStartContainerResponse()

    return Servicer()


class PluginServer:
    """Serve the plugin, register with kubelet, re-register when kubelet restarts.

    Parameters
    ----------
    gpus, pods, node
        As for ``make_servicer``.
    plugin_dir : Path
        kubelet's device-plugin directory (``kubelet.sock`` lives there).
    mps_pipe_dir : Path, optional
        As for ``make_servicer``.
    on_allocate, on_register : callable, optional
        Called per container Allocate (with its result) and after each registration with
        kubelet (the agent's metrics).
    """

    def __init__(self, gpus: Callable[[], Sequence[GpuSlots]], pods: Callable[[], Sequence[Mapping[str, Any]]],
                 node: str, plugin_dir: Path = DEFAULT_PLUGIN_DIR, mps_pipe_dir: Path | None = None,
                 on_allocate: Callable[[str], object] = lambda result: None,
                 on_register: Callable[[], object] = lambda: None) -> None:
        self._gpus, self._pods, self._node = gpus, pods, node
        self._on_allocate, self._on_register = on_allocate, on_register
        self._mps = None if mps_pipe_dir is None else str(mps_pipe_dir)
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / SOCKET_NAME
        self.changed = threading.Event()
        self._stop = threading.Event()
        self._stream_stop = threading.Event()
        self._server: grpc.Server | None = None
        self._matcher = assign.Matcher()  # outlives each server: see make_servicer
        self.registrations = 0

    def _serve(self) -> None:
        if self._server is not None:
            self._stream_stop.set()
            self._server.stop(grace=0.5).wait()
        self._stream_stop = threading.Event()
        if self.socket.exists():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS))
        _, pb_grpc = load()
        pb_grpc.add_DevicePluginServicer_to_server(
            make_servicer(self._gpus, self._pods, self._node, self.changed, self._stream_stop, self._mps,
                          self._on_allocate, self._matcher), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def _register(self) -> None:
        pb, pb_grpc = load()
        with grpc.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
            pb_grpc.RegistrationStub(channel).Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=SOCKET_NAME, resource_name=ann.RESOURCE_GPU,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=True)), timeout=10)
        self.registrations += 1
        log.info("registered %s with kubelet (%s)", ann.RESOURCE_GPU, self.plugin_dir)
        self._on_register()

    def start_once(self) -> None:
        """Serve and register once.

        Raises
        ------
        grpc.RpcError
            When kubelet refuses or cannot be reached.
        """
        self._serve()
        self._register()

    def run(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Serve and keep registered until ``stop``: a new ``kubelet.sock`` (kubelet
        restarted) or a vanished plugin socket means serve and register again."""
        kubelet = self.plugin_dir / "kubelet.sock"
        registered: tuple[int, int] | None = None
        while not stop.is_set():
            try:
                st = os.stat(kubelet)
                ident: tuple[int, int] | None = (st.st_ino, st.st_ctime_ns)  # an inode may be reused
            except FileNotFoundError:
                ident = None
            if ident is not None and (ident != registered or not self.socket.exists()):
                try:
                    self.start_once()
                    registered = ident
                except grpc.RpcError as exc:
                    log.warning("registration with kubelet failed: %s", exc)
            stop.wait(poll_s)
        self.close()

    def close(self) -> None:
        """Stop serving and remove the socket."""
        self._stream_stop.set()
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
        if self.socket.exists():
            self.socket.unlink()
