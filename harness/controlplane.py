"""A real Kubernetes control plane on 127.0.0.1, for the end-to-end tests and benchmarks.

Builds kube-apiserver, kube-scheduler and kubectl from the Go modules pinned in
``harness/kube/go.mod`` (``k8s.io/kubernetes`` with its staging modules replaced by their
published releases) into a cache directory keyed by that go.mod and go.sum, so later runs
reuse them; installs Debian's ``etcd-server`` when no ``etcd`` is on the machine. Then starts
etcd, kube-apiserver (self-signed CA, client-certificate authentication, RBAC), and on demand
gpufrac in cluster mode and kube-scheduler with the project's ``scheduler-config.yaml``
(only the extender URL rewritten to gpufrac's test port).

There is no controller-manager and no kubelet: ``add_fake_node`` does what they would (node
status with capacity, allocatable and the Ready condition, no not-ready taint) and publishes
the ``gpufrac.io/inventory`` annotation an agent would. Every process is stopped by its PID.

Pitfalls this follows are in ``../shared/kube-scheduler-wire/README.md`` (copied in spirit,
not in code): the ServiceAccount admission plugin is disabled (no token controller), new
nodes' not-ready taint is removed by hand, node status goes through the status subresource.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
GO_MODULE_DIR = Path(__file__).resolve().parent / "kube"
COMMANDS = ("kube-apiserver", "kube-scheduler", "kubectl")
LOOPBACK = "127.0.0.1"


class ControlPlaneError(RuntimeError):
    """A control-plane binary could not be built or a process did not come up."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


# -- binaries ------------------------------------------------------------------------------

def kube_version() -> str:
    """The ``k8s.io/kubernetes`` version pinned in ``harness/kube/go.mod``."""
    for line in (GO_MODULE_DIR / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:2] == ["require", "k8s.io/kubernetes"]:
            return parts[2]
    raise ControlPlaneError("harness/kube/go.mod does not require k8s.io/kubernetes")


def build_kube_binaries(cache_root: Path | None = None) -> dict[str, Path]:
    """Build (or reuse) kube-apiserver, kube-scheduler and kubectl.

    Parameters
    ----------
    cache_root : Path, optional
        Where builds are kept; ``$GPUFRAC_KUBE_CACHE`` or ``~/.cache/gpufrac/kube`` by default.
        Each go.mod/go.sum pair gets its own subdirectory.

    Returns
    -------
    dict of str to Path
        Command name to binary.

    Raises
    ------
    ControlPlaneError
        If ``go`` is missing or the build fails (its output included).
    """
    return build_go_commands(GO_MODULE_DIR, {c: f"k8s.io/kubernetes/cmd/{c}" for c in COMMANDS},
                             kube_version(), cache_root, ldflags=kube_ldflags())


def kube_ldflags() -> str:
    """The version stamp Kubernetes' release builds link in (``hack/lib/version.sh``): without
    it the binaries report ``v0.0.0-master``, and Helm's ``kubeVersion`` check and
    ``.Capabilities.KubeVersion`` see that instead of the release."""
    version = kube_version()
    major, minor = version.removeprefix("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return (f"-X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} "
            f"-X {pkg}.gitTreeState=clean")


def build_go_commands(module_dir: Path, packages: dict[str, str], tag: str,
                      cache_root: Path | None = None, ldflags: str = "") -> dict[str, Path]:
    """Build (or reuse) Go commands from the module in ``module_dir``.

    Parameters
    ----------
    module_dir : Path
        A directory with go.mod and go.sum pinning the commands' module.
    packages : dict of str to str
        Command name to its import path.
    tag : str
        Readable part of the cache directory's name (the version).
    cache_root : Path, optional
        As ``build_kube_binaries``'s; each go.mod/go.sum pair (and ``ldflags``) gets its own
        subdirectory.
    ldflags : str
        ``go build -ldflags`` (``kube_ldflags`` for Kubernetes' commands).

    Returns
    -------
    dict of str to Path
        Command name to binary.

    Raises
    ------
    ControlPlaneError
        If ``go`` is missing or the build fails (its output included).
    """
    root = cache_root or Path(os.environ.get("GPUFRAC_KUBE_CACHE", Path.home() / ".cache/gpufrac/kube"))
    digest = hashlib.sha256(
        (module_dir / "go.mod").read_bytes() + (module_dir / "go.sum").read_bytes()
        + ldflags.encode()).hexdigest()[:12]
    out = root / f"{tag}-{digest}"
    bins = {c: out / c for c in packages}
    if all(p.exists() for p in bins.values()):
        return bins
    go = shutil.which("go")
    if go is None:
        raise ControlPlaneError(f"go is not installed: it is needed to build {', '.join(packages)}")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out))
    cmd = [go, "build", "-trimpath", *(["-ldflags", ldflags] if ldflags else []), "-o", str(tmp) + "/",
           *packages.values()]
    print(f"building {', '.join(packages)} {tag} (first run only; minutes)", file=sys.stderr)
    proc = subprocess.run(cmd, cwd=module_dir, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ControlPlaneError(f"go build failed:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    for c, path in packages.items():
        os.replace(tmp / path.rsplit("/", 1)[-1], bins[c])
    shutil.rmtree(tmp, ignore_errors=True)
    return bins


def installed(command: str) -> Path | None:
    """Path of ``command`` on $PATH or in /usr/sbin or /usr/bin; None when absent."""
    found = shutil.which(command) or next(
        (p for p in (f"/usr/sbin/{command}", f"/usr/bin/{command}") if Path(p).exists()), None)
    return Path(found) if found else None


def ensure_debian(command: str, package: str) -> Path:
    """Path of ``command``; installs Debian's ``package`` with apt-get if it is missing.

    Raises
    ------
    ControlPlaneError
        If it is missing and cannot be installed.
    """
    found = installed(command)
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None:
        raise ControlPlaneError(f"{command} is not installed and apt-get is not available")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    for cmd in ([*sudo, apt, "update", "-qq"], [*sudo, apt, "install", "-y", "-qq", package]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise ControlPlaneError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    found = installed(command)
    if found is None:
        raise ControlPlaneError(f"{package} installed but {command} not found")
    return found


def ensure_etcd() -> Path:
    """Path of ``etcd``; installs Debian's ``etcd-server`` with apt-get if it is missing.

    Raises
    ------
    ControlPlaneError
        If it is missing and cannot be installed.
    """
    found = installed("etcd")
    if found:
        return found
    path = ensure_debian("etcd", "etcd-server")
    # Debian starts the service on install; ours runs its own etcd on other ports.
    subprocess.run([*([] if os.geteuid() == 0 else ["sudo", "-n"]), "systemctl", "stop", "etcd"],
                   capture_output=True)
    return path


# -- certificates --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Pki:
    """Files of the test PKI: CA, apiserver serving cert, service-account keys, client certs."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    directory: Path

    def client(self, user: str, groups: Iterable[str] = ()) -> tuple[Path, Path]:
        """A client certificate (CN = user, O = groups) signed by the CA: (cert, key)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)  # the CA this harness made
        ca = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject = x509.Name([*names, x509.NameAttribute(NameOID.COMMON_NAME, user)])
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        slug = hashlib.sha1(user.encode()).hexdigest()[:10]
        cert_path, key_path = self.directory / f"client-{slug}.crt", self.directory / f"client-{slug}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path


def make_pki(directory: Path) -> Pki:
    """Self-signed CA, a serving cert for 127.0.0.1/localhost, and a service-account key pair."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    pem = serialization.Encoding.PEM

    def write_key(key: Any, path: Path) -> None:
        path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufrac-test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
           .issuer_name(ca_name).public_key(srv_key.public_key()).serial_number(x509.random_serial_number())
           .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
           .add_extension(x509.SubjectAlternativeName([
               x509.DNSName("localhost"), x509.DNSName("kubernetes.default.svc"),
               x509.IPAddress(ipaddress.ip_address(LOOPBACK)),
               x509.IPAddress(ipaddress.ip_address("10.0.0.1"))]), critical=False)
           .sign(ca_key, hashes.SHA256()))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki = Pki(directory / "ca.crt", directory / "ca.key", directory / "apiserver.crt",
              directory / "apiserver.key", directory / "sa.key", directory / "sa.pub", directory)
    pki.ca_cert.write_bytes(ca.public_bytes(pem))
    write_key(ca_key, pki.ca_key)
    pki.serving_cert.write_bytes(srv.public_bytes(pem))
    write_key(srv_key, pki.serving_key)
    write_key(sa_key, pki.sa_key)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


# -- processes -----------------------------------------------------------------------------

@dataclass
class Proc:
    """A started process, its log file, and how to stop it."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; by PID (the process group)."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout_s)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL now (crash simulation)."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def tail(self, n: int = 4000) -> str:
        """The end of the process's log."""
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def start(name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> Proc:
    """Start ``cmd`` in its own process group with stdout+stderr to ``workdir/name.log``."""
    log = workdir / f"{name}.log"
    fh = log.open("ab")
    popen = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, **(env or {})})
    fh.close()
    return Proc(name, popen, log, list(cmd), env)


def wait_until(check: Any, timeout_s: float, what: str, proc: Proc | None = None,
               interval_s: float = 0.2) -> Any:
    """Poll ``check()`` until it returns a truthy value; raise with the process log if not."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise ControlPlaneError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - polling: keep the last error for the message
            last = exc
        time.sleep(interval_s)
    tail = proc.tail() if proc else ""
    raise ControlPlaneError(f"timed out after {timeout_s}s waiting for {what} (last error: {last})\n{tail}")


def kubeconfig(path: Path, server: str, pki: Pki, user: str, groups: Iterable[str] = ()) -> Path:
    """Write a kubeconfig for ``user`` authenticating with a client certificate."""
    cert, key = pki.client(user, groups)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server,
                                                  "certificate-authority": str(pki.ca_cert)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
    }))
    return path


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

    def start_gpufrac(self, port: int, kubeconfig_path: Path | None = None,
                      extra: Iterable[str] = (), name: str = "gpufrac", wrapper: Sequence[str] = ()) -> Proc:
        """Start ``gpufrac serve --mode cluster`` on ``port`` and wait for ``/readyz``
        (``wrapper``: a command to run it under, e.g. ``faketime -f +600s``)."""
        proc = self.track(start(name, [
            *wrapper, sys.executable, "-m", "extender", "serve", "--mode", "cluster",
            "--kubeconfig", str(kubeconfig_path or self.admin_kubeconfig),
            "--host", LOOPBACK, "--port", str(port), "--log-level", "info", *extra], self.workdir))
        wait_until(lambda: _http_ok(f"http://{LOOPBACK}:{port}/readyz"), 60, "gpufrac /readyz", proc)
        return proc

    def start_scheduler(self, extender_url: str | None, name: str = "kube-scheduler",
                        config: Path = ROOT / "scheduler-config.yaml",
                        kubeconfig_path: Path | None = None, qps: int = 0,
                        drop_verbs: Iterable[str] = (), profile: str | None = None,
                        leader_lease_s: float | None = None, lease: tuple[str, str] | None = None) -> Proc:
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
        wait_until(lambda: _https_ok(f"https://{LOOPBACK}:{port}/healthz"), 60, f"{name} /healthz", proc)
        return proc

    def start_controller_manager(self) -> Proc:
        """Start kube-controller-manager (built on first use) and wait for its health check.

        Every on-by-default controller runs but those that act on nodes' conditions and
        clouds: the real node (``harness/node.py``) stays NotReady without a CNI, and the
        node-lifecycle and taint-eviction controllers would taint it ``NoExecute`` and evict
        the pods on it.
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
            "--controllers=*," + ",".join(f"-{c}" for c in off), "--v=1"], self.workdir))
        wait_until(lambda: _https_ok(f"https://{LOOPBACK}:{port}/healthz"), 90, "kube-controller-manager /healthz",
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


def _http_ok(url: str) -> bool:
    import httpx

    return httpx.get(url, timeout=2).status_code == 200


def _https_ok(url: str) -> bool:
    import httpx

    return httpx.get(url, timeout=2, verify=False).status_code == 200


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
