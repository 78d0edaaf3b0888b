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


def make_servicer(gpus: Callable[[], Sequence[GpuSlots]], pods: Callable[[], Sequence[Mapping[str, Any]]],
                  node: str, changed: threading.Event, stop: threading.Event,
                  mps_pipe_dir: str | None = None, on_allocate: Callable[[str], object] = lambda result: None) -> Any:
    """The DevicePlugin servicer (a class built on the generated base, which is loaded lazily).

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
        Called once per container Allocate with its result (``"ok"`` or ``"no_pod"``).
    """
    pb, pb_grpc = load()
    matcher = assign.Matcher()
    lock = threading.Lock()

    # The servicer base comes from the stubs generated at run time (stubs.load()): untyped.
    class Servicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc,name-defined]
        def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
            return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

        def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
            last: list[tuple[str, bool]] | None = None
            while not stop.is_set() and context.is_active():
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
            out = []
            with lock:
                cands = assign.candidates(pods(), node)
                for creq in request.container_requests:
                    found = matcher.peek(creq.allocation_size, cands)
                    want = set(found[0].slice_for(found[1])[0]) if found else set()
                    chosen = list(creq.must_include_deviceIDs)
                    used = {gpu_of(d) for d in chosen}
                    for d in creq.available_deviceIDs:
                        if len(chosen) >= creq.allocation_size:
                            break
                        g = gpu_of(d)
                        if d not in chosen and g in want and g not in used:
                            chosen.append(d)
                            used.add(g)
                    for d in creq.available_deviceIDs:  # no record: any slots, kubelet decides
                        if len(chosen) >= creq.allocation_size:
                            break
                        if d not in chosen:
                            chosen.append(d)
                    out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
            return pb.PreferredAllocationResponse(container_responses=out)

        def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
            responses = []
            with lock:
                cands = assign.candidates(pods(), node)
                for creq in request.container_requests:
                    n = len(creq.devices_ids)
                    found = matcher.take(n, cands)
                    if found is None:
                        on_allocate("no_pod")
                        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                      f"gpufrac: no pod on {node} bound by gpufrac waits for {n} "
                                      f"{ann.RESOURCE_GPU} (is the pod using schedulerName gpufrac-scheduler?)")
                        raise RuntimeError("grpc context.abort returned")  # it raises
                    pod, index = found
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
        self.registrations = 0

    def _serve(self) -> None:
        if self._server is not None:
            self._stream_stop.set()
            self._server.stop(grace=0.5).wait()
        self._stream_stop = threading.Event()
        if self.socket.exists():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        _, pb_grpc = load()
        pb_grpc.add_DevicePluginServicer_to_server(
            make_servicer(self._gpus, self._pods, self._node, self.changed, self._stream_stop, self._mps,
                          self._on_allocate), server)
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
