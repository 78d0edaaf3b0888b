"""gpufrac's DRA kubelet plugin: registration, NodePrepareResources / NodeUnprepareResources, CDI.

kubelet finds DRA drivers in its plugin registration directory (``<kubelet root>/plugins_registry``):
a socket there serves ``pluginregistration.Registration`` (``GetInfo``: type ``DRAPlugin``, name
``gpu.gpufrac.io``, the endpoint of the DRA service and the services it speaks, ``v1.DRAPlugin``).
kubelet then calls the DRA service (``k8s.io/kubelet/pkg/apis/dra/v1``) on that endpoint before a
pod with a claim of the driver starts (``NodePrepareResources``) and after it ends
(``NodeUnprepareResources``). Both services come from stubs generated as the device plugin's are
(``agent.deviceplugin.stubs``).

Prepare. kubelet sends claim references only (namespace, name, UID). For each, the plugin reads
the claim from the API server, takes the results of ``gpu.gpufrac.io`` (``podspec.claims``: an
untrusted status, bounded), checks that each is in this node's pool and names a healthy GPU of
the inventory the agent published, and writes one CDI spec file per claim
(``<cdi dir>/gpufrac.io-gpu_<claim uid>.json``, written to a temporary name and renamed, so the
runtime never reads half of one) with a CDI device per request of the claim. Its container edits
are what the device plugin gives a container (``agent.deviceplugin.assign``): the GPUs' UUIDs,
the MPS limits below a whole GPU (the smallest share among the request's GPUs), the MPS pipe
directory. The answer names those devices (``gpufrac.io/gpu=<claim uid>-<request>``), and the
container runtime applies them (containerd 2 reads CDI specs from ``/etc/cdi`` and ``/var/run/cdi``).
A container that uses two requests of one claim gets both devices, and the later one's
``NVIDIA_VISIBLE_DEVICES`` wins: ask for several GPUs in one request.

Unprepare removes the claim's file. Both are idempotent (kubelet retries them). What kubelet
sends is bounded (``MAX_CLAIMS_PER_CALL``; a UID must look like one, so it never reaches a path
unchecked); a claim that cannot be read, was replaced (another UID), holds nothing of this node's,
or names a GPU this node does not have healthy gets an error for that claim alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agent.deviceplugin import assign
from agent.deviceplugin.stubs import load
from podspec.annotations import NodeInventory
from podspec.claims import DRIVER, asked_memory_mib, claim_allocation, device_names
from podspec.quantities import PodSpecError, quote

log = logging.getLogger(__name__)

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/plugins") / DRIVER
DEFAULT_CDI_DIR = Path("/var/run/cdi")
CDI_KIND = "gpufrac.io/gpu"
CDI_VERSION = "0.6.0"
SERVICE = "v1.DRAPlugin"
"""The DRA gRPC service this plugin speaks, as kubelet names it (``drapbv1.DRAPluginService``)."""
MAX_CLAIMS_PER_CALL = 256
WORKERS = 4
_UID = re.compile(r"[0-9a-fA-F-]{1,64}", re.ASCII)


class ClaimError(Exception):
    """A claim cannot be prepared; the message is what kubelet shows on the pod."""


ReadClaim = Callable[[str, str], Mapping[str, Any]]
"""``(namespace, name) -> ResourceClaim`` (raises ``ClaimError`` when it cannot be read)."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as the answer to kubelet names it."""

    request: str
    pool: str
    device: str
    cdi_device_id: str
    share_id: str | None


def cdi_spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    """The claim's CDI spec file."""
    return cdi_dir / f"{CDI_KIND.replace('/', '-')}_{claim_uid}.json"


def check_uid(uid: object) -> str:
    """A claim UID from kubelet, checked before it names a file.

    Raises
    ------
    ClaimError
        Not a string of hex digits and dashes, 1-64 long.
    """
    if not isinstance(uid, str) or not _UID.fullmatch(uid):
        raise ClaimError(f"claim uid {quote(uid)} is not a UID")
    return uid


def check_ref(namespace: object, name: object, uid: object) -> str:
    """A claim reference from kubelet, bounded before it reaches a URL or a path; its UID.

    Raises
    ------
    ClaimError
        A namespace over 63 or a name over 253 characters, or a UID that is not one.
    """
    if not isinstance(namespace, str) or not 0 < len(namespace) <= 63:
        raise ClaimError(f"claim namespace {quote(namespace)} is not a namespace name")
    if not isinstance(name, str) or not 0 < len(name) <= 253:
        raise ClaimError(f"claim name {quote(name)} is not an object name")
    return check_uid(uid)


def prepare_claim(claim: Mapping[str, Any], uid: str, node: str, inventory: NodeInventory | None,
                  mps_pipe_dir: str | None) -> tuple[dict[str, Any], list[PreparedDevice]]:
    """The CDI spec and the answer for one claim (module notes); writes nothing.

    Parameters
    ----------
    claim : mapping
        The ResourceClaim as read from the API server.
    uid : str
        The UID kubelet names (``check_uid``).
    node : str
        This node (the pool of its slice).
    inventory : NodeInventory or None
        What the agent published; None before its first reading.
    mps_pipe_dir : str or None
        The MPS control daemon's pipe directory on the host.

    Returns
    -------
    spec : dict
        The CDI spec (``cdiVersion``, ``kind``, ``devices``), one device per request.
    devices : list of PreparedDevice

    Raises
    ------
    ClaimError
        Why the claim cannot be prepared on this node.
    """
    try:
        alloc = claim_allocation(claim, DRIVER)
    except PodSpecError as exc:
        raise ClaimError(f"claim status unreadable: {exc}") from None
    where = f"claim {alloc.namespace}/{alloc.name}"
    if alloc.uid != uid:
        raise ClaimError(f"{where} has uid {alloc.uid}, not {uid}: it was replaced")
    if not alloc.devices:
        raise ClaimError(f"{where} is not allocated any {DRIVER} device")
    listed = sorted(inventory.gpus, key=lambda g: g.index) if inventory is not None else []
    gpus = dict(zip(device_names([g.index for g in listed]), listed, strict=True))
    by_request: dict[str, list[Any]] = {}
    for share in alloc.devices:
        if share.pool != node:
            raise ClaimError(f"{where}: device {share.device} is in pool {quote(share.pool)}, not this node's ({node})")
        gpu = gpus.get(share.device)
        if gpu is None:
            raise ClaimError(f"{where}: node {node} has no GPU {quote(share.device)}")
        if not gpu.healthy:
            raise ClaimError(f"{where}: GPU {share.device} ({gpu.uuid}) on {node} is unhealthy")
        by_request.setdefault(share.request, []).append((share, gpu))
    cdi_devices, prepared = [], []
    for request, pairs in by_request.items():
        name = f"{uid}-{request.replace('/', '.')}"
        gpu_milli = min(s.gpu_milli for s, _g in pairs)
        # No memory asked: the share's part of the GPU's memory, rounded down as the extender
        # counts it (scoring.fit.gpu_memory_request_mib; numpy is not loaded here for one product).
        memory = [m if (m := asked_memory_mib(s.memory_mib)) is not None else g.memory_mib * s.gpu_milli // 1000
                  for s, g in pairs]
        env = assign.container_env([g.uuid for _s, g in pairs], gpu_milli, memory)
        mps_env, mps_mounts = assign.container_mps(gpu_milli, mps_pipe_dir)
        edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in {**env, **mps_env}.items()]}
        if mps_mounts:
            edits["mounts"] = [{"hostPath": h, "containerPath": c, "options": ["rbind", "rw"]} for c, h in mps_mounts]
        cdi_devices.append({"name": name, "containerEdits": edits})
        prepared += [PreparedDevice(request, s.pool, s.device, f"{CDI_KIND}={name}", s.share_id) for s, _g in pairs]
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": cdi_devices}, prepared


def write_spec(path: Path, spec: Mapping[str, Any]) -> None:
    """Write ``spec`` to ``path`` whole: a hidden temporary file in the same directory, renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(spec, sort_keys=True))
    os.replace(tmp, path)


class DraDriver:
    """The two services' logic, apart from gRPC (testable without kubelet).

    Parameters
    ----------
    node : str
    read_claim : ReadClaim
    inventory : callable
        The inventory the agent published last (None before the first).
    cdi_dir : Path
    mps_pipe_dir : Path, optional
    """

    def __init__(self, node: str, read_claim: ReadClaim, inventory: Callable[[], NodeInventory | None],
                 cdi_dir: Path = DEFAULT_CDI_DIR, mps_pipe_dir: Path | None = None) -> None:
        self.node, self.read_claim, self.inventory, self.cdi_dir = node, read_claim, inventory, cdi_dir
        self._mps = None if mps_pipe_dir is None else str(mps_pipe_dir)

    def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        """Prepare one claim: its CDI spec written, the devices to answer.

        Raises
        ------
        ClaimError
        """
        uid = check_ref(namespace, name, uid)
        spec, devices = prepare_claim(self.read_claim(namespace, name), uid, self.node, self.inventory(), self._mps)
        try:
            write_spec(cdi_spec_path(self.cdi_dir, uid), spec)
        except OSError as exc:
            raise ClaimError(f"CDI spec for claim {namespace}/{name} not written: {exc}") from None
        log.info("prepared claim %s/%s: %s", namespace, name, ", ".join(d.cdi_device_id for d in devices))
        return devices

    def unprepare(self, namespace: str, name: str, uid: str) -> None:
        """Remove the claim's CDI spec (none is fine: kubelet retries).

        Raises
        ------
        ClaimError
        """
        uid = check_ref(namespace, name, uid)
        try:
            cdi_spec_path(self.cdi_dir, uid).unlink(missing_ok=True)
        except OSError as exc:
            raise ClaimError(f"CDI spec for claim {namespace}/{name} not removed: {exc}") from None
        log.info("unprepared claim %s/%s", namespace, name)


def make_servicers(driver: DraDriver, endpoint: Path, on_registered: Callable[[], object]) -> tuple[Any, Any]:
    """``(DRAPlugin servicer, Registration servicer)`` on the generated bases (loaded lazily)."""
    pb, pb_grpc = load(api="dra")
    rpb, rpb_grpc = load(api="registration")

    def each(request: Any, context: Any, call: Callable[[Any], Any], empty: Any) -> dict[str, Any]:
        if len(request.claims) > MAX_CLAIMS_PER_CALL:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(request.claims)} claims in one call, more than {MAX_CLAIMS_PER_CALL}")
        out: dict[str, Any] = {}
        for claim in request.claims:
            try:
                out[claim.uid] = call(claim)
            except ClaimError as exc:
                log.warning("claim %s/%s: %s", claim.namespace[:63], claim.name[:253], exc)
                out[claim.uid] = empty(error=f"gpufrac: {exc}")
        return out

    class DraServicer(pb_grpc.DRAPluginServicer):  # type: ignore[misc,name-defined]
        def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
            def one(claim: Any) -> Any:
                devices = driver.prepare(claim.namespace, claim.name, claim.uid)
                return pb.NodePrepareResourceResponse(devices=[pb.Device(
                    request_names=[d.request.split("/")[0]], pool_name=d.pool, device_name=d.device,
                    cdi_device_ids=[d.cdi_device_id], **({"share_id": d.share_id} if d.share_id else {}))
                    for d in devices])
            return pb.NodePrepareResourcesResponse(
                claims=each(request, context, one, pb.NodePrepareResourceResponse))

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
            def one(claim: Any) -> Any:
                driver.unprepare(claim.namespace, claim.name, claim.uid)
                return pb.NodeUnprepareResourceResponse()
            return pb.NodeUnprepareResourcesResponse(
                claims=each(request, context, one, pb.NodeUnprepareResourceResponse))

    class RegistrationServicer(rpb_grpc.RegistrationServicer):  # type: ignore[misc,name-defined]
        def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
            return rpb.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=str(endpoint), supported_versions=[SERVICE])

        def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
            if request.plugin_registered:
                log.info("registered with kubelet as DRA driver %s", DRIVER)
                on_registered()
            else:
                log.error("kubelet refused DRA driver %s: %s", DRIVER, request.error[:500])
            return rpb.RegistrationStatusResponse()

    return DraServicer(), RegistrationServicer()


class DraPluginServer:
    """Serve the DRA service and the registration socket until stopped.

    Parameters
    ----------
    driver : DraDriver
    plugin_dir : Path
        Where the DRA service's socket goes (``dra.sock``).
    registry_dir : Path
        kubelet's plugin registration directory (``<driver>-reg.sock`` goes there).
    on_registered : callable, optional
        Called when kubelet says the driver is registered (the agent rewrites its ResourceSlice:
        kubelet deletes a node's slices when it starts).
    """

    def __init__(self, driver: DraDriver, plugin_dir: Path = DEFAULT_PLUGIN_DIR,
                 registry_dir: Path = DEFAULT_REGISTRY_DIR, on_registered: Callable[[], object] = lambda: None) -> None:
        self.driver = driver
        self.socket = plugin_dir / "dra.sock"
        self.registration_socket = registry_dir / f"{DRIVER}-reg.sock"
        self._on_registered = on_registered
        self._server: grpc.Server | None = None
        self.registrations = 0

    def _registered(self) -> None:
        self.registrations += 1
        self._on_registered()

    def start(self) -> None:
        """(Re)start serving both sockets."""
        self.close()
        for sock in (self.socket, self.registration_socket):
            sock.parent.mkdir(parents=True, exist_ok=True)
            sock.unlink(missing_ok=True)
        _, pb_grpc = load(api="dra")
        _, rpb_grpc = load(api="registration")
        dra, registration = make_servicers(self.driver, self.socket, self._registered)
        dra_server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS))
        pb_grpc.add_DRAPluginServicer_to_server(dra, dra_server)
        rpb_grpc.add_RegistrationServicer_to_server(registration, dra_server)
        dra_server.add_insecure_port(f"unix://{self.socket}")
        dra_server.add_insecure_port(f"unix://{self.registration_socket}")
        dra_server.start()
        self._server = dra_server

    def run(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Serve until ``stop``; serve again when a socket vanished (kubelet finds the
        registration socket anew, even after its own restart)."""
        self.start()
        while not stop.wait(poll_s):
            if not (self.socket.exists() and self.registration_socket.exists()):
                log.warning("a DRA socket vanished; serving again")
                self.start()
        self.close()

    def close(self) -> None:
        """Stop serving and remove the sockets."""
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
        for sock in (self.socket, self.registration_socket):
            sock.unlink(missing_ok=True)


def claim_reader(api_client: Any, timeout_s: tuple[float, float] = (3.0, 10.0)) -> ReadClaim:
    """Read a ResourceClaim through the API (``get`` on ``resourceclaims``)."""
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.rest import ApiException

    from podspec.kubeio import response_json

    api = CustomObjectsApi(api_client)

    def read(namespace: str, name: str) -> Mapping[str, Any]:
        try:
            found: Mapping[str, Any] = response_json(api.get_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, "resourceclaims", name, _preload_content=False,
                _request_timeout=timeout_s))
            return found
        except ApiException as exc:
            raise ClaimError(f"claim {namespace}/{name} not read: {exc.status} {exc.reason}") from None
        except (OSError, ValueError) as exc:
            raise ClaimError(f"claim {namespace}/{name} not read: {exc}") from None
    return read


__all__: Sequence[str] = ("CDI_KIND", "ClaimError", "DraDriver", "DraPluginServer", "PreparedDevice",
                          "cdi_spec_path", "check_ref", "check_uid", "claim_reader", "prepare_claim")
