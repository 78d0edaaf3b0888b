"""Binaries the harness needs: Kubernetes' commands built from the Go modules pinned in
``harness/kube/go.mod`` (cached by the hash of go.mod and go.sum), other Go commands
(``build_go_commands``), and Debian's packages installed with apt-get when a command is
missing (``ensure_debian``, ``ensure_etcd``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.processes import ControlPlaneError

GO_MODULE_DIR = Path(__file__).resolve().parent / "kube"
COMMANDS = ("kube-apiserver", "kube-scheduler", "kubectl")


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


def libfaketime() -> Path:
    """Path of libfaketime (Debian's ``faketime``, installed with apt-get if missing), for
    ``LD_PRELOAD`` with ``FAKETIME`` set.

    Preloaded directly rather than through the ``faketime`` wrapper: the wrapper names a
    POSIX semaphore and a shared-memory segment after its own PID and leaves both in
    ``/dev/shm`` when it is killed, so a later wrapper that is given the same PID fails to
    start ("faketime: sem_open: File exists"). A relative offset needs neither.

    Raises
    ------
    ControlPlaneError
        If the package cannot be installed, or holds no ``libfaketime.so.1``.
    """
    ensure_debian("faketime", "faketime")
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1")) + sorted(
        Path("/usr/lib/faketime").glob("libfaketime.so.1"))
    if not found:
        raise ControlPlaneError("faketime is installed but libfaketime.so.1 was not found under /usr/lib")
    return found[0]


def drop_libfaketime_segments(pid: int) -> None:
    """Remove the semaphore and shared memory libfaketime created for process ``pid``, if it
    left them (it does when killed); a later process given the same PID would otherwise
    find them taken."""
    for name in (f"sem.faketime_sem_{pid}", f"faketime_shm_{pid}"):
        (Path("/dev/shm") / name).unlink(missing_ok=True)


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
    # Debian starts the service on install where systemd runs; ours runs its own etcd on other
    # ports. A machine without systemd (a container, a chroot) has no systemctl and no service.
    systemctl = shutil.which("systemctl")
    if systemctl is not None:
        subprocess.run([*([] if os.geteuid() == 0 else ["sudo", "-n"]), systemctl, "stop", "etcd"],
                       capture_output=True)
    return path


