"""What the node agent reads from the GPUs: one backend on NVML (``pynvml``), one fake.

Both give the same ``GpuReading`` records and XID events, so everything above this module
(inventory, health, publishing) is tested without a GPU on the fake and run on the real one
unchanged. Units: MiB for memory, percent for utilization.

Health follows NVIDIA's k8s-device-plugin (``internal/rm/health.go``): a critical XID marks
the GPU unhealthy unless it is one of the application errors that plugin ignores by default
(13, 31, 43, 45, 68, 109: faults of one CUDA program, not of the GPU).
"""

from __future__ import annotations

import queue
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

MIB = 1024 * 1024

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs that do not make a GPU unhealthy (k8s-device-plugin's default skip list)."""


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver library, no GPU, init failed)."""


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """A compute process on a GPU: its PID and the GPU memory it uses (MiB)."""

    pid: int
    memory_used_mib: int


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device (a hardware slice) of a GPU in MIG mode."""

    index: int
    uuid: str
    profile: str
    """e.g. ``1g.10gb``."""
    memory_total_mib: int
    memory_used_mib: int


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as NVML reports it at one instant."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int
    utilization_pct: int
    compute_mode: str
    """``default``, ``exclusive_process`` or ``prohibited``."""
    mig_enabled: bool = False
    mig_devices: tuple[MigReading, ...] = ()
    processes: tuple[ProcessReading, ...] = ()


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical XID error reported for one GPU."""

    uuid: str
    xid: int

    @property
    def fatal(self) -> bool:
        """True when the GPU should be marked unhealthy."""
        return self.xid not in APPLICATION_XIDS


class NvmlBackend(Protocol):
    """What the agent needs from NVML."""

    def read(self) -> list[GpuReading]:
        """Every GPU, in index order."""

    def wait_xid(self, timeout_s: float) -> XidEvent | None:
        """The next critical XID event, or None after ``timeout_s``."""

    def close(self) -> None:
        """Release NVML."""


_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


class PynvmlBackend:
    """NVML through ``pynvml`` (the ``nvidia-ml-py`` package).

    Raises
    ------
    NvmlUnavailable
        From the constructor, when the NVML library is missing or ``nvmlInit`` fails, with
        one line saying why (no traceback for the operator).
    """

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable("pynvml is not installed (package nvidia-ml-py)") from None
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not be initialised ({exc}): is the NVIDIA driver "
                                  "installed and libnvidia-ml.so.1 visible to this container?") from None
        self._events: Any = None
        self._uuid_by_handle: dict[int, str] = {}

    def _mig_devices(self, handle: Any) -> tuple[bool, tuple[MigReading, ...]]:
        nv = self._nv
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
        except nv.NVMLError:
            return False, ()  # not MIG-capable
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return False, ()
        out = []
        for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nv.NVMLError:
                continue  # slot not populated
            mem = nv.nvmlDeviceGetMemoryInfo(mig)
            name = nv.nvmlDeviceGetName(mig)
            out.append(MigReading(i, nv.nvmlDeviceGetUUID(mig), str(name).split(" ")[-1],
                                  int(mem.total) // MIB, int(mem.used) // MIB))
        return True, tuple(out)

    def read(self) -> list[GpuReading]:
        """Read every GPU (see ``NvmlBackend.read``)."""
        nv = self._nv
        out = []
        for index in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(index)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                util = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except nv.NVMLError:
                util = 0  # not supported (e.g. in MIG mode)
            try:
                procs = tuple(ProcessReading(int(p.pid), int(p.usedGpuMemory or 0) // MIB)
                              for p in nv.nvmlDeviceGetComputeRunningProcesses(h))
            except nv.NVMLError:
                procs = ()
            mig_enabled, migs = self._mig_devices(h)
            out.append(GpuReading(
                index=index, uuid=str(nv.nvmlDeviceGetUUID(h)), name=str(nv.nvmlDeviceGetName(h)),
                memory_total_mib=int(mem.total) // MIB, memory_used_mib=int(mem.used) // MIB,
                utilization_pct=util,
                compute_mode=_COMPUTE_MODES.get(int(nv.nvmlDeviceGetComputeMode(h)), "unknown"),
                mig_enabled=mig_enabled, mig_devices=migs, processes=procs))
        return out

    def _register_events(self) -> None:
        nv = self._nv
        self._events = nv.nvmlEventSetCreate()
        for index in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(index)
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
            except nv.NVMLError:
                continue  # events not supported on this GPU: it can only be read
            self._uuid_by_handle[id(h)] = str(nv.nvmlDeviceGetUUID(h))

    def wait_xid(self, timeout_s: float) -> XidEvent | None:
        """Block up to ``timeout_s`` for a critical XID (see ``NvmlBackend.wait_xid``)."""
        nv = self._nv
        if self._events is None:
            self._register_events()
        try:
            data = nv.nvmlEventSetWait_v2(self._events, int(timeout_s * 1000))
        except nv.NVMLError_Timeout:
            return None
        return XidEvent(str(nv.nvmlDeviceGetUUID(data.device)), int(data.eventData))

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        nv = self._nv
        if self._events is not None:
            nv.nvmlEventSetFree(self._events)
            self._events = None
        nv.nvmlShutdown()


@dataclass
class FakeNvml:
    """A deterministic NVML for tests and for nodes without GPUs (``--nvml fake``).

    Parameters
    ----------
    gpus : sequence of GpuReading
        What ``read`` returns (replace with ``set_gpus``, change one with ``update``).
    """

    gpus: Sequence[GpuReading]
    _xids: queue.Queue[XidEvent] = field(default_factory=queue.Queue)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FakeNvml:
        """Build from ``{"gpus": [{"name", "memory_mib", "count"?, "mig"?: [...], "xid"?}, ...]}``.

        UUIDs are ``GPU-fake-<node>-<index>``; ``node`` comes from the config's ``node``. A
        GPU with ``xid`` reports that XID once, at start (what a GPU that failed looks like to
        the agent's health tracker).
        """
        node = str(config.get("node", "node"))
        out: list[GpuReading] = []
        for spec in config.get("gpus", []):
            for _ in range(int(spec.get("count", 1))):
                i = len(out)
                migs = tuple(
                    MigReading(j, f"MIG-fake-{node}-{i}-{j}", str(m["profile"]), int(m["memory_mib"]), 0)
                    for j, m in enumerate(spec.get("mig", [])))
                out.append(GpuReading(i, f"GPU-fake-{node}-{i}", str(spec["name"]), int(spec["memory_mib"]),
                                      0, 0, "default", bool(migs), migs))
        fake = cls(out)
        start = 0
        for spec in config.get("gpus", []):
            count = int(spec.get("count", 1))
            if "xid" in spec:
                for g in out[start:start + count]:
                    fake.inject_xid(g.uuid, int(spec["xid"]))
            start += count
        return fake

    def read(self) -> list[GpuReading]:
        """The configured GPUs."""
        return list(self.gpus)

    def update(self, index: int, **changes: Any) -> None:
        """Change one GPU's reading (memory used, processes...)."""
        gpus = list(self.gpus)
        gpus[index] = replace(gpus[index], **changes)
        self.gpus = gpus

    def inject_xid(self, uuid: str, xid: int) -> None:
        """Queue an XID event, as the driver would report it."""
        self._xids.put(XidEvent(uuid, xid))

    def wait_xid(self, timeout_s: float) -> XidEvent | None:
        """The next injected XID, or None after ``timeout_s``."""
        try:
            return self._xids.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return None

    def close(self) -> None:
        """Nothing to release."""


__all__ = ["APPLICATION_XIDS", "FakeNvml", "GpuReading", "MigReading", "NvmlBackend", "NvmlUnavailable",
           "ProcessReading", "PynvmlBackend", "XidEvent"]
