"""A real Kubernetes control plane on 127.0.0.1, for the end-to-end tests and benchmarks.

Builds kube-apiserver, kube-scheduler and kubectl from the Go modules pinned in
``harness/kube/go.mod`` (``k8s.io/kubernetes`` with its staging modules replaced by their
published releases) into a cache directory keyed by that go.mod and go.sum, so later runs
reuse them; installs Debian's ``etcd-server`` when no ``etcd`` is on the machine
(``harness.builds``). Then starts
etcd, kube-apiserver (self-signed CA, client-certificate authentication, RBAC), and on demand
gpufrac in cluster mode and kube-scheduler with the project's ``scheduler-config.yaml``
(only the extender URL rewritten to gpufrac's test port).

There is no controller-manager and no kubelet: ``add_fake_node`` does what they would (node
status with capacity, allocatable and the Ready condition, no not-ready taint) and publishes
the ``gpufrac.io/inventory`` annotation an agent would. Every process is stopped by its PID
(``harness.processes``); the certificates are ``harness.pki``'s.

Pitfalls this follows are in ``../shared/kube-scheduler-wire/README.md`` (copied in spirit,
not in code): the ServiceAccount admission plugin is disabled (no token controller), new
nodes' not-ready taint is removed by hand, node status goes through the status subresource.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.builds import (
    GO_MODULE_DIR,
    build_go_commands,
    build_kube_binaries,
    ensure_etcd,
    kube_ldflags,
    kube_version,
)
from harness.pki import Pki, kubeconfig, make_pki
from harness.processes import LOOPBACK, ROOT, ControlPlaneError, Proc, free_port, start, wait_until


@dataclass(frozen=True)
class ExtenderTls:
    """Mutual TLS between kube-scheduler and an extender, as the chart deploys it: the extender
    serves with a certificate for 127.0.0.1 and requires a client certificate its CA signed;
    kube-scheduler checks the serving certificate and presents its own. Every key is the
    harness CA's ECDSA P-256 (the chart's cert-manager ``Certificate``s ask for the same).

    Attributes
    ----------
    cert, key : Path
        The extender's serving certificate and key (PEM).
    client_ca : Path
        The CA that signed the serving certificate and the clients' (PEM).
    client_cert, client_key : Path
        kube-scheduler's client certificate and key (PEM).
    """

    cert: Path
    key: Path
    client_ca: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def of(cls, pki: Pki, client: str = "kube-scheduler-extender-client") -> ExtenderTls:
        """The PKI's serving certificate for 127.0.0.1 and a new client certificate (CN
        ``client``) for kube-scheduler."""
        cert, key = pki.client(client)
        return cls(pki.serving_cert, pki.serving_key, pki.ca_cert, cert, key)

    def serve_args(self) -> list[str]:
        """``gpufrac serve``'s flags for it."""
        return ["--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key),
                "--tls-client-ca-file", str(self.client_ca)]

    def client_context(self) -> Any:
        """An ``ssl.SSLContext`` trusting the CA and presenting the client certificate (for
        probes from the harness)."""
        import ssl

        ctx = ssl.create_default_context(cafile=str(self.client_ca))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def scheduler_tls_config(self) -> dict[str, str]:
        """The extender's ``tlsConfig`` in a ``KubeSchedulerConfiguration``."""
        return {"caFile": str(self.client_ca), "certFile": str(self.client_cert), "keyFile": str(self.client_key)}


@dataclass
class ControlPlane:
    """etcd + kube-apiserver on loopback, plus the processes started on top of it.

    Use ``ControlPlane.up(workdir)``; ``down()`` stops everything it started, by PID.
    """

    workdir: Path
    bins: dict[str, Path]
    pki: Pki
    server: str
    admin_kubeconfig: Path
    procs: list[Proc] = field(default_factory=list)

    @classmethod
    def up(cls, workdir: Path, service_accounts: bool = False) -> ControlPlane:
        """Build or reuse the binaries, then start etcd and kube-apiserver and wait for ready.

        ``service_accounts`` keeps the ServiceAccount admission plugin on (pods get their
        service account's token mounted, as in a real cluster); it then needs
        ``start_controller_manager`` (which creates each namespace's ``default`` account and
        the ``kube-root-ca.crt`` ConfigMap the token volume reads).

        Raises
        ------
        ControlPlaneError
            Build, install or start-up failure, with the relevant log.
        """
        bins = build_kube_binaries()
        etcd = ensure_etcd()
        workdir.mkdir(parents=True, exist_ok=True)
        pki = make_pki(workdir / "pki")
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        server = f"https://{LOOPBACK}:{api_port}"
        cp = cls(workdir, bins, pki, server, workdir / "admin.kubeconfig")
        try:
            etcd_proc = cp.track(start("etcd", [
                str(etcd), "--data-dir", str(workdir / "etcd"), "--name", "gpufrac-test",
                "--listen-client-urls", f"http://{LOOPBACK}:{etcd_port}",
                "--advertise-client-urls", f"http://{LOOPBACK}:{etcd_port}",
                "--listen-peer-urls", f"http://{LOOPBACK}:{peer_port}",
                "--initial-advertise-peer-urls", f"http://{LOOPBACK}:{peer_port}",
                "--initial-cluster", f"gpufrac-test=http://{LOOPBACK}:{peer_port}",
                "--unsafe-no-fsync"], workdir, env={"ETCD_UNSUPPORTED_ARCH": "amd64"}))
            wait_until(lambda: _http_ok(f"http://{LOOPBACK}:{etcd_port}/health"), 30, "etcd", etcd_proc)
            api = cp.track(start("kube-apiserver", [
                str(bins["kube-apiserver"]),
                f"--etcd-servers=http://{LOOPBACK}:{etcd_port}",
                f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}",
                f"--secure-port={api_port}",
                f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                *([] if service_accounts else ["--disable-admission-plugins=ServiceAccount"]),
                # The real node (harness/node.py) is "localhost": kubelet listens on
                # 127.0.0.1 only and refuses a loopback node IP, so logs go by its Hostname.
                "--kubelet-preferred-address-types=Hostname,InternalIP,ExternalIP",
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
                "--profiling=false", "--v=1"], workdir))
            kubeconfig(cp.admin_kubeconfig, server, pki, "gpufrac-test-admin", ["system:masters"])
            wait_until(lambda: cp.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
                       90, "kube-apiserver /readyz", api, interval_s=0.5)
            # The default namespace and RBAC bootstrap roles appear shortly after readyz.
            wait_until(lambda: cp.kubectl("get", "namespace", "default", check=False).returncode == 0,
                       60, "namespace default", api, interval_s=0.5)
        except BaseException:
            cp.down()
            raise
        return cp

    def track(self, proc: Proc) -> Proc:
        """Remember ``proc`` so that ``down`` stops it."""
        self.procs.append(proc)
        return proc

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None,
                kubeconfig_path: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this API server (admin credentials by default)."""
        cmd = [str(self.bins["kubectl"]), f"--kubeconfig={kubeconfig_path or self.admin_kubeconfig}", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, input=input_text, timeout=120)
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def user_kubeconfig(self, user: str, groups: Iterable[str] = ()) -> Path:
        """A kubeconfig for another identity (e.g. a service account's user name)."""
        slug = hashlib.sha1(user.encode()).hexdigest()[:10]
        return kubeconfig(self.workdir / f"{slug}.kubeconfig", self.server, self.pki, user, groups)

    def extender_tls(self, client: str = "kube-scheduler-extender-client") -> ExtenderTls:
        """Mutual TLS for an extender on loopback: ``ExtenderTls.of`` this control plane's PKI."""
        return ExtenderTls.of(self.pki, client)

    def start_gpufrac(self, port: int, kubeconfig_path: Path | None = None,
                      extra: Iterable[str] = (), name: str = "gpufrac", wrapper: Sequence[str] = (),
                      tls: ExtenderTls | None = None) -> Proc:
        """Start ``gpufrac serve --mode cluster`` on ``port`` and wait for ``/readyz``
        (``wrapper``: a command to run it under, e.g. ``env LD_PRELOAD=<libfaketime> FAKETIME=+600s``;
        ``tls``: serve HTTPS requiring client certificates, probed with ``tls``'s own)."""
        proc = self.track(start(name, [
            *wrapper, sys.executable, "-m", "extender", "serve", "--mode", "cluster",
            "--kubeconfig", str(kubeconfig_path or self.admin_kubeconfig),
            "--host", LOOPBACK, "--port", str(port), "--log-level", "info",
            *(tls.serve_args() if tls is not None else ()), *extra], self.workdir))
        scheme, verify = ("http", True) if tls is None else ("https", tls.client_context())
        wait_until(lambda: _http_ok(f"{scheme}://{LOOPBACK}:{port}/readyz", verify), 60, "gpufrac /readyz", proc)
        return proc

    def start_scheduler(self, extender_url: str | None, name: str = "kube-scheduler",
                        config: Path = ROOT / "scheduler-config.yaml",
                        kubeconfig_path: Path | None = None, qps: int = 0,
                        drop_verbs: Iterable[str] = (), profile: str | None = None,
                        leader_lease_s: float | None = None, lease: tuple[str, str] | None = None,
                        extender_tls: ExtenderTls | None = None) -> Proc:
        """Start kube-scheduler with the project's config, only the extender URL rewritten.

        Parameters
        ----------
        extender_url : str or None
            gpufrac's ``http://127.0.0.1:PORT``; None drops the ``extenders`` section (the
            "no extender" baseline of the throughput benchmark).
        qps : int
            When > 0, raises ``clientConnection.qps``/``burst`` (throughput runs).
        drop_verbs : iterable of str
            Extender config keys to remove (``bindVerb`` for an extender that does not bind).
        profile : str, optional
            Another ``schedulerName`` for the profile (a second scheduler beside the
            session's, for its own pods).
        leader_lease_s : float, optional
            Run with leader election on (Lease ``kube-system/<profile>``) with this lease
            duration; renew deadline 3/4 of it, retry period 1/4. Off otherwise (the
            project's config has it on, for deploy's replicas).
        lease : tuple of (str, str), optional
            With ``leader_lease_s``: the Lease's ``(namespace, name)`` instead of
            ``kube-system/<profile>`` (deploy's is ``gpufrac-system/gpufrac-scheduler``).
        extender_tls : ExtenderTls, optional
            With an ``https`` ``extender_url``: the extender's ``tlsConfig`` (the CA and
            kube-scheduler's client certificate) instead of the config's in-cluster paths.
        """
        cfg = yaml.safe_load(config.read_text())
        # One scheduler per profile in tests unless asked: no Lease to wait for between runs.
        cfg["leaderElection"] = {"leaderElect": False}
        if profile is not None:
            cfg["profiles"][0]["schedulerName"] = profile
        if leader_lease_s is not None:
            cfg["leaderElection"] = {
                "leaderElect": True, "resourceNamespace": lease[0] if lease else "kube-system",
                "resourceName": lease[1] if lease else profile or cfg["profiles"][0]["schedulerName"],
                "leaseDuration": f"{leader_lease_s}s", "renewDeadline": f"{0.75 * leader_lease_s}s",
                "retryPeriod": f"{0.25 * leader_lease_s}s"}
        if extender_url is None:
            cfg.pop("extenders", None)
        else:
            for ext in cfg.get("extenders", []):
                ext["urlPrefix"] = extender_url
                if extender_url.startswith("http://"):  # the tests' gpufrac: plain HTTP on loopback
                    ext.pop("enableHTTPS", None)
                    ext.pop("tlsConfig", None)
                elif extender_tls is not None:
                    ext.update({"enableHTTPS": True, "tlsConfig": extender_tls.scheduler_tls_config()})
                for key in drop_verbs:
                    ext.pop(key, None)
        kc = kubeconfig_path or self.admin_kubeconfig
        cfg["clientConnection"] = {"kubeconfig": str(kc)}
        if qps:
            cfg["clientConnection"].update({"qps": qps, "burst": qps})
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        port = free_port()
        proc = self.track(start(name, [
            str(self.bins["kube-scheduler"]), f"--config={path}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            f"--bind-address={LOOPBACK}", f"--secure-port={port}", "--v=2"], self.workdir))
        wait_until(lambda: _http_ok(f"https://{LOOPBACK}:{port}/healthz", False), 60, f"{name} /healthz", proc)
        return proc

    def start_controller_manager(self, only: Sequence[str] = ()) -> Proc:
        """Start kube-controller-manager (built on first use) and wait for its health check.

        Every on-by-default controller runs but those that act on nodes' conditions and
        clouds: the real node (``harness/node.py``) stays NotReady without a CNI, and the
        node-lifecycle and taint-eviction controllers would taint it ``NoExecute`` and evict
        the pods on it. ``only``: these controllers and no other (e.g.
        ``resourceclaim-controller`` beside a session's tests that expect none).
        """
        bins = build_go_commands(GO_MODULE_DIR.parent / "controller-manager",
                                 {"kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager"},
                                 kube_version(), ldflags=kube_ldflags())
        port = free_port()
        kc = self.admin_kubeconfig
        off = ("node-lifecycle-controller", "taint-eviction-controller", "node-ipam-controller",
               "cloud-node-lifecycle-controller", "node-route-controller", "service-lb-controller")
        proc = self.track(start("kube-controller-manager", [
            str(bins["kube-controller-manager"]), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", f"--bind-address={LOOPBACK}", f"--secure-port={port}",
            "--leader-elect=false", f"--root-ca-file={self.pki.ca_cert}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            "--controllers=" + (",".join(only) if only else "*," + ",".join(f"-{c}" for c in off)), "--v=1"],
            self.workdir))
        wait_until(lambda: _http_ok(f"https://{LOOPBACK}:{port}/healthz", False), 90, "kube-controller-manager /healthz",
                   proc)
        return proc

    def proc(self, name: str) -> Proc:
        """The newest started process called ``name``."""
        return next(p for p in reversed(self.procs) if p.name == name)

    def restart(self, name: str, down_s: float = 0.0, kill: bool = False) -> Proc:
        """Stop the process ``name`` (SIGTERM, or SIGKILL with ``kill``), wait ``down_s``
        seconds, start it again with the same command line and data, and wait until the API
        server answers ``/readyz`` (fault injection: an API server restart, an etcd outage).
        """
        old = self.proc(name)
        old.kill() if kill else old.stop()
        self.procs.remove(old)
        time.sleep(down_s)
        new = self.track(start(name, old.cmd, self.workdir, old.env))
        api = self.proc("kube-apiserver")
        wait_until(lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
                   120, "kube-apiserver /readyz after a restart", api, interval_s=0.5)
        return new

    def down(self) -> None:
        """Stop every started process, newest first, by PID."""
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()


def _http_ok(url: str, verify: Any = True) -> bool:
    """200 from ``url`` (``verify``: httpx's; False for the self-signed health ports)."""
    import httpx

    return httpx.get(url, timeout=2, verify=verify).status_code == 200


# -- fake nodes ----------------------------------------------------------------------------

def inventory_annotation(node: str, gpus: list[dict[str, Any]], heartbeat: dt.datetime | None = None) -> str:
    """The ``gpufrac.io/inventory`` value an agent would publish for ``gpus``."""
    from podspec.annotations import GpuInventory, NodeInventory, dump_inventory

    beat = heartbeat or dt.datetime.now(dt.UTC)
    return dump_inventory(NodeInventory(node=node, heartbeat=beat,
                                        gpus=[GpuInventory(**g) for g in gpus]))


def fake_node_gpus(node: str, n_gpus: int, model: str = "A10", memory_mib: int = 24576,
                   replicas: int = 4) -> list[dict[str, Any]]:
    """GPU inventory entries for a fake node (UUIDs derived from node and index)."""
    return [{"index": i, "uuid": f"GPU-{hashlib.sha1(f'{node}/{i}'.encode()).hexdigest()[:24]}",
             "model": model, "memory_mib": memory_mib, "replicas": replicas} for i in range(n_gpus)]


def add_fake_node(api: Any, name: str, gpus: list[dict[str, Any]], cpu: str = "32",
                  memory: str = "128Gi", pods: int = 110,
                  heartbeat: dt.datetime | None = None, publish_inventory: bool = True) -> None:
    """Create a Node as a kubelet + agent would leave it: Ready, allocatable, inventory.

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
    name : str
    gpus : list of dict
        ``GpuInventory`` fields per GPU (see ``fake_node_gpus``).
    publish_inventory : bool
        False leaves the ``gpufrac.io/inventory`` annotation to a running agent.
    """
    from kubernetes import client

    slots = sum(int(g.get("replicas", 1)) for g in gpus)
    annotations = {"gpufrac.io/inventory": inventory_annotation(name, gpus, heartbeat)} if publish_inventory else {}
    api.create_node(client.V1Node(metadata=client.V1ObjectMeta(
        name=name, labels={"kubernetes.io/hostname": name, "gpufrac.io/test": "true"},
        annotations=annotations)))
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), "gpufrac.io/gpu": str(slots)}
    api.patch_node_status(name, {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "fake node", "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }})
    # Admission adds node.kubernetes.io/not-ready; the node lifecycle controller would
    # remove it once Ready. There is no controller-manager here.
    api.patch_node(name, {"spec": {"taints": None}})
