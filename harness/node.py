"""A real node for the end-to-end tests: kubelet, containerd 2.x and runc on 127.0.0.1.

kubelet is built from the same ``k8s.io/kubernetes`` release as the control plane
(``harness/kubelet``), containerd and its runc shim from their Go module
(``harness/containerd``; Kubernetes 1.36 no longer supports the containerd 1.x Debian
ships), runc and busybox from Debian's packages. Images cannot be pulled here: a sandbox
("pause") image and a workload image are written from Debian's static busybox as Docker
archives and imported into containerd. What this machine needed, each in one place below:

- cgroup v1 (the hosts' cgroup layout here): kubelet's ``failCgroupV1: false``, with the
  cgroupfs driver and no per-QoS cgroups;
- no ``CAP_SYS_RESOURCE`` in this sandbox: runc cannot set the negative
  ``oom_score_adj`` the CRI asks for sandboxes, so containerd runs with
  ``restrict_oom_score_adj``;
- no CNI: pods run with ``hostNetwork`` (kubelet then starts them although the runtime
  reports its network not ready) and tolerate the ``not-ready`` taint kubelet registers the
  node with (no kube-controller-manager here removes it);
- the node is named ``localhost`` so that the API server reaches kubelet's 127.0.0.1
  listener by its Hostname address (``kubectl logs``): kubelet refuses a loopback node IP;
- the device-plugin directory is kubelet's fixed ``/var/lib/kubelet/device-plugins``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.builds import build_go_commands, ensure_debian, kube_ldflags, kube_version
from harness.controlplane import ControlPlane
from harness.processes import LOOPBACK, ControlPlaneError, Proc, free_port, start, wait_until

HARNESS = Path(__file__).resolve().parent
NODE_NAME = "localhost"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
PAUSE_IMAGE = "gpufrac.test/pause:1"
BUSYBOX_IMAGE = "gpufrac.test/busybox:1"
NOT_READY_TOLERATION = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}
"""What the tests' pods tolerate: the taint kubelet registers the node with."""


def build_node_binaries() -> dict[str, Path]:
    """kubelet, containerd, containerd-shim-runc-v2 and ctr (built once, then cached)."""
    kubelet = build_go_commands(HARNESS / "kubelet", {"kubelet": "k8s.io/kubernetes/cmd/kubelet"}, kube_version(),
                                ldflags=kube_ldflags())
    containerd = build_go_commands(HARNESS / "containerd", {
        c: f"github.com/containerd/containerd/v2/cmd/{c}" for c in ("containerd", "containerd-shim-runc-v2", "ctr")},
        "containerd-v2")
    return {**kubelet, **containerd}


def busybox_image(path: Path, ref: str, entrypoint: list[str], busybox: Path) -> Path:
    """Write a one-layer Docker archive of ``busybox`` (with a few applet links) named ``ref``."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        for d in ("bin", "tmp", "etc", "proc", "sys", "dev"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            t.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        t.addfile(info, io.BytesIO(data))
        for applet in ("sh", "sleep", "env", "sort", "cat", "echo"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(info)
    blob = layer.getvalue()
    config = {"architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
              "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
              "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(blob).hexdigest()]}}
    manifest = [{"Config": "config.json", "RepoTags": [ref], "Layers": ["layer.tar"]}]
    with tarfile.open(path, "w") as t:
        for name, content in (("config.json", json.dumps(config).encode()), ("layer.tar", blob),
                              ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            t.addfile(info, io.BytesIO(content))
    return path


@dataclass
class RealNode:
    """containerd and kubelet running as node ``localhost`` of ``cp``."""

    cp: ControlPlane
    workdir: Path
    bins: dict[str, Path]
    runc: Path
    containerd: Proc
    kubelet: Proc
    kubelet_port: int

    @property
    def socket(self) -> Path:
        """containerd's CRI socket."""
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def cdi_dir(self) -> Path:
        """The directory containerd reads CDI specs from (a DRA driver writes them there)."""
        return self.workdir / "cdi"

    @property
    def plugins_registry(self) -> Path:
        """kubelet's plugin registration directory (DRA drivers register there)."""
        return self.workdir / "kubelet" / "root" / "plugins_registry"

    @classmethod
    def up(cls, cp: ControlPlane) -> RealNode:
        """Build what is missing, start containerd, import the images, start kubelet and wait
        until the Node is registered.

        Raises
        ------
        ControlPlaneError
            A build, an install or a process start failed (with its log).
        """
        bins = build_node_binaries()
        runc = ensure_debian("runc", "runc")
        busybox = ensure_debian("busybox", "busybox-static")
        workdir = cp.workdir / "node"
        (workdir / "containerd").mkdir(parents=True, exist_ok=True)
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        node = cls(cp, workdir, bins, runc, None, None, free_port())  # type: ignore[arg-type]
        node.containerd = node._start_containerd()
        for ref, entrypoint in ((PAUSE_IMAGE, ["/bin/sleep", "2147483647"]), (BUSYBOX_IMAGE, ["/bin/sh"])):
            archive = busybox_image(workdir / f"{ref.split('/')[-1].replace(':', '-')}.tar", ref, entrypoint, busybox)
            node.ctr("images", "import", "--local", "--platform", "linux/amd64", "--snapshotter", "native",
                     str(archive))
        node.kubelet = node.start_kubelet()
        return node

    def ctr(self, *args: str) -> str:
        """Run ``ctr`` in containerd's ``k8s.io`` namespace; its output."""
        proc = subprocess.run([str(self.bins["ctr"]), "--address", str(self.socket), "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise ControlPlaneError(f"ctr {' '.join(args)}: {proc.stderr[-2000:]}")
        return proc.stdout

    def _start_containerd(self) -> Proc:
        d = self.workdir / "containerd"
        self.cdi_dir.mkdir(parents=True, exist_ok=True)  # watched from the start (DRA drivers write there)
        config = f"""version = 3
root = "{d / 'root'}"
state = "{d / 'state'}"
[grpc]
  address = "{self.socket}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{self.runc}"
        Root = "{d / 'runc'}"
        SystemdCgroup = false
"""
        (d / "config.toml").write_text(config)
        env = {**os.environ, "PATH": f"{self.bins['containerd-shim-runc-v2'].parent}:{os.environ.get('PATH', '')}"}
        proc = self.cp.track(start("containerd", [str(self.bins["containerd"]), "--config", str(d / "config.toml")],
                                   self.workdir, env=env))
        wait_until(lambda: self.socket.exists(), 30, "containerd socket", proc)
        return proc

    def start_kubelet(self) -> Proc:
        """Start (or restart) kubelet and wait until the Node reports it posting status."""
        d = self.workdir / "kubelet"
        d.mkdir(exist_ok=True)
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": LOOPBACK, "port": self.kubelet_port, "healthzBindAddress": LOOPBACK, "healthzPort": 0,
            "readOnlyPort": 0,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False, "evictionHard": {}, "localStorageCapacityIsolation": False,
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99, "resolvConf": "",
            "podLogsDir": str(d / "pod-logs"), "nodeStatusUpdateFrequency": "2s",
            # ConfigMap volumes follow their object within a pod sync (the admin config reload).
            "syncFrequency": "10s"}
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        since = time.time()
        proc = self.cp.track(start("kubelet", [
            str(self.bins["kubelet"]), f"--config={d / 'config.yaml'}", f"--kubeconfig={self.cp.admin_kubeconfig}",
            f"--root-dir={d / 'root'}", f"--cert-dir={d / 'pki'}", f"--hostname-override={NODE_NAME}", "--v=2"],
            self.workdir))

        def posted() -> bool:
            out = self.cp.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            for cond in json.loads(out.stdout)["status"].get("conditions", []):
                if cond["type"] == "Ready":
                    beat = dt.datetime.fromisoformat(cond["lastHeartbeatTime"].replace("Z", "+00:00"))
                    return beat.timestamp() >= since - 1
            return False
        wait_until(posted, 90, "kubelet posting node status", proc)
        return proc

    def restart_kubelet(self) -> Proc:
        """Stop kubelet and start it again (containers keep running; the device-plugin socket
        directory is wiped by kubelet on start, as on a real node)."""
        self.kubelet.stop()
        self.kubelet = self.start_kubelet()
        return self.kubelet

    def down(self) -> None:
        """Stop kubelet, remove every container it left, stop containerd, delete containerd's
        content and snapshots (gigabytes with the chart's images; logs stay for a failed test)."""
        self.kubelet.stop()
        runc_root = self.workdir / "containerd" / "runc" / "k8s.io"
        if runc_root.exists():
            for cid in subprocess.run([str(self.runc), "--root", str(runc_root), "list", "-q"],
                                      capture_output=True, text=True).stdout.split():
                subprocess.run([str(self.runc), "--root", str(runc_root), "delete", "--force", cid],
                               capture_output=True)
        self.containerd.stop()
        # Sandbox /dev/shm and rootfs mounts containerd leaves when stopped with pods on it.
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for target in sorted((m for m in mounts if m.startswith(str(self.workdir) + "/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True)
        for p in Path("/proc").iterdir():  # shims of this node (their cmdline names our socket)
            try:
                if p.name.isdigit() and str(self.socket) in (p / "cmdline").read_bytes().decode(errors="replace"):
                    os.kill(int(p.name), 9)
            except (OSError, ValueError):
                continue
        shutil.rmtree(self.workdir / "containerd" / "root", ignore_errors=True)
        for archive in self.workdir.glob("*.tar"):
            archive.unlink(missing_ok=True)
