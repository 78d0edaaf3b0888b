"""gpufrac's images built as a user builds them: ``deploy/Dockerfile`` with Debian's buildah.

Registry base images cannot be pulled on these machines, so the Dockerfile's two base
arguments get stand-ins built here, each cached in buildah's storage under a tag that names
its recipe (a later run with the same recipe reuses it):

- ``PYTHON_BASE``: Debian bookworm (Python 3.11) from ``mmdebstrap``, with pip, venv and
  the CA store, ``python``/``pip`` on PATH and pip allowed to install into the system (as in
  ``python:3.11-slim``); no compiler.
- ``GO_BASE``: this machine's Go toolchain in ``/usr/local/go`` (what ``golang:1.26`` carries
  there; only the stubs stage uses it and nothing of it ships).

Builds mount the machine's CA bundle over ``/etc/ssl/certs`` (pip and ``go mod download``
go through this machine's proxy, as behind a corporate one). A kube-scheduler image is made
from the harness's own binary on the Python stand-in (the binary links glibc). ``archive``
writes an image as a Docker archive for ``ctr images import``; ``files`` lists an image's
paths, for the scan of what an image must not contain.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness import docs
from harness.builds import ensure_debian, kube_version
from harness.processes import ROOT, ControlPlaneError

SUITE = "bookworm"
PYTHON_PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates")
PYTHON_HOOK = ('rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED; ln -sf python3 "$1"/usr/bin/python; '
               'ln -sf pip3 "$1"/usr/bin/pip; rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*')
"""What ``python:3.11-slim`` has that Debian's python3 lacks: ``python``/``pip`` and a pip
that installs into the system."""
CA_MOUNT = "/etc/ssl/certs:/etc/ssl/certs:ro"
EXTENDER_IMAGE = "localhost/gpufrac/gpufrac"
AGENT_IMAGE = "localhost/gpufrac/gpufrac-agent"
SCHEDULER_IMAGE = "localhost/gpufrac-test/kube-scheduler"
DANGLING_KEEP_S = 12 * 3600
"""Untagged images younger than this stay (layer cache for the next build of the same
sources); older ones go before a build."""


def buildah(*args: str, timeout_s: float = 900, cwd: Path | None = None) -> str:
    """Run Debian's buildah (installed on first use); its stdout.

    Raises
    ------
    ControlPlaneError
        When it fails (the tail of its output included).
    """
    exe = ensure_debian("buildah", "buildah")
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    if proc.returncode != 0:
        raise ControlPlaneError(f"buildah {' '.join(args[:3])} ... failed ({proc.returncode}):\n"
                                f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout.strip()


def buildah_may_fail(*args: str) -> subprocess.CompletedProcess[str]:
    """Run Debian's buildah where a failure is an answer (no such image, image still in use)."""
    exe = ensure_debian("buildah", "buildah")
    return subprocess.run([str(exe), *args], capture_output=True, text=True)


def exists(ref: str) -> bool:
    """Whether buildah's storage holds the image ``ref``."""
    return buildah_may_fail("inspect", "--type", "image", ref).returncode == 0


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def python_base() -> str:
    """The stand-in for ``python:3.11-slim`` (built once per recipe); its reference."""
    ref = f"localhost/gpufrac-standin/python:3.11-{_key(SUITE, *PYTHON_PACKAGES, PYTHON_HOOK)}"
    if exists(ref):
        return ref
    mmdebstrap = ensure_debian("mmdebstrap", "mmdebstrap")
    print(f"building {ref} with mmdebstrap (first run only; about a minute)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        proc = subprocess.run([str(mmdebstrap), "--variant=minbase", "--aptopt=APT::Install-Recommends \"false\"",
                               f"--include={','.join(PYTHON_PACKAGES)}", f"--customize-hook={PYTHON_HOOK}",
                               SUITE, str(rootfs)], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise ControlPlaneError(f"mmdebstrap failed:\n{proc.stderr[-3000:]}")
        ctr = buildah("from", "scratch")
        try:
            buildah("add", ctr, str(rootfs), "/")
            buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--cmd", "python3", ctr)
            buildah("commit", "-q", ctr, ref)
        finally:
            buildah("rm", ctr)
    return ref


def go_base() -> str:
    """The stand-in for ``golang:1.26``: this machine's Go toolchain in /usr/local/go."""
    go = subprocess.run(["go", "env", "GOROOT", "GOVERSION"], capture_output=True, text=True)
    if go.returncode != 0:
        raise ControlPlaneError(f"go is needed for the stubs stage's stand-in: {go.stderr}")
    goroot, version = go.stdout.split()
    ref = f"localhost/gpufrac-standin/golang:{version.removeprefix('go')}"
    if exists(ref):
        return ref
    ctr = buildah("from", "scratch")
    try:
        buildah("add", ctr, goroot, "/usr/local/go")
        buildah("commit", "-q", ctr, ref)
    finally:
        buildah("rm", ctr)
    return ref


def role_image(target: str, tag: str = "test") -> str:
    """``deploy/Dockerfile``'s ``target`` (extender or agent) built on the stand-ins, by the
    command ``docs/install.md`` gives (its tag replaced, the stand-in bases and the CA mount
    added, run from the repository root as the doc's ``.`` says).

    Layers are cached (``--layers``): a rebuild with the same sources costs seconds.
    """
    ref = f"{EXTENDER_IMAGE if target == 'extender' else AGENT_IMAGE}:{tag}"
    argv = shlex.split(docs.command("docs/install.md", f"buildah build -f deploy/Dockerfile --target {target} "))
    assert argv[:2] == ["buildah", "build"] and "-t" in argv, argv
    argv[argv.index("-t") + 1] = ref
    with _building():
        _prune_dangling(DANGLING_KEEP_S)
        previous = image_id(ref)
        buildah(*argv[1:2], *_build_args(), *argv[2:], cwd=ROOT)
        _drop(previous, ref)
    return ref


def _build_args() -> tuple[str, ...]:
    """What every build of ``deploy/Dockerfile`` here adds to the doc's command: the layer
    cache, the stand-in bases and this machine's CA bundle (for pip)."""
    return ("--layers", "-q", "--build-arg", f"PYTHON_BASE={python_base()}",
            "--build-arg", f"GO_BASE={go_base()}", "-v", CA_MOUNT)


@contextlib.contextmanager
def _building() -> Iterator[None]:
    """Hold the storage lock around image builds, and remove the working containers they
    leave: buildah 1.28 leaves the one of a stage that only names a base (`FROM ${GO_BASE}
    AS go`, read by `COPY --from=go`): one per build, ~0.3 GB each."""
    with _storage_lock():
        containers = _containers()
        try:
            yield
        finally:
            for ctr in _containers() - containers:
                buildah("rm", ctr)


@contextlib.contextmanager
def _storage_lock() -> Iterator[None]:
    """Serialize image builds with any other run of the suite on this machine (CI and a
    developer's run share buildah's storage: a build must not remove another's containers)."""
    with open(Path(tempfile.gettempdir()) / "gpufrac-image-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def image_id(ref: str) -> str | None:
    """The ID of the image ``ref`` names in buildah's storage; None when there is none."""
    proc = buildah_may_fail("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _prune_dangling(older_than_s: float) -> None:
    """Remove untagged images older than ``older_than_s`` (an earlier build's stages, e.g.
    the stubs stage after the agent's sources changed); newer ones stay as layer cache."""
    listing = buildah("images", "--filter", "dangling=true", "--format", "{{.ID}}|{{.CreatedAtRaw}}")
    now = dt.datetime.now(dt.UTC)
    for line in listing.splitlines():
        image, _, created = line.partition("|")
        try:  # "2026-11-26 19:10:55.330209652 +0000 UTC"
            day, clock, offset = created.split()[:3]
            when = dt.datetime.strptime(f"{day} {clock.split('.')[0]} {offset}", "%Y-%m-%d %H:%M:%S %z")
        except ValueError:
            continue
        if (now - when).total_seconds() > older_than_s:
            buildah_may_fail("rmi", image)


def release(registry: str) -> str:
    """``docs/install.md``'s one command (``deploy/release.sh REGISTRY``) as written, the
    registry replaced, on the stand-in bases (its ``BUILD_ARGS``, with the CA mount and
    buildah's layer cache) with buildah and the harness's Helm on ``PATH``; its output. The
    chart package lands in the repository's ``dist/`` as the doc says.

    Raises
    ------
    ControlPlaneError
        When the script fails (its output's tail included).
    """
    from harness.helm import build_helm

    argv = shlex.split(docs.command("docs/install.md", "deploy/release.sh "))
    assert argv[0] == "deploy/release.sh" and len(argv) == 2, argv
    exe = ensure_debian("buildah", "buildah")
    env = {**os.environ, "PATH": f"{exe.parent}:{build_helm().parent}:{os.environ['PATH']}",
           "BUILD_ARGS": " ".join(_build_args())}
    with _building():
        proc = subprocess.run([argv[0], registry], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise ControlPlaneError(f"deploy/release.sh failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                                f"{proc.stderr[-3000:]}")
    return proc.stdout


def _containers() -> set[str]:
    return set(buildah("containers", "-q", "--notruncate").split())


def _drop(previous: str | None, ref: str) -> None:
    """Remove the image ``ref`` named before a rebuild (untagged now, half a gigabyte a
    build); kept when something still uses it."""
    if previous is not None and previous != image_id(ref):
        buildah_may_fail("rmi", previous)


def scheduler_image(binary: Path) -> str:
    """A kube-scheduler image holding the harness's own ``binary`` (the chart's
    ``scheduler.image.repository`` points here in the tests)."""
    ref = f"{SCHEDULER_IMAGE}:{kube_version()}"
    digest = _key(hashlib.sha256(binary.read_bytes()).hexdigest(), python_base())
    if exists(ref) and digest in buildah("inspect", "--format", "{{.ImageAnnotations}}", ref):
        return ref
    previous = image_id(ref)
    ctr = buildah("from", python_base())
    try:
        buildah("copy", "--chmod", "0755", ctr, str(binary), "/usr/local/bin/kube-scheduler")
        buildah("config", "--annotation", f"gpufrac.test/source={digest}", "--user", "65532:65532",
                "--entrypoint", '["/usr/local/bin/kube-scheduler"]', ctr)
        buildah("commit", "-q", ctr, ref)
    finally:
        buildah("rm", ctr)
    _drop(previous, ref)
    return ref


def archive(ref: str, path: Path) -> Path:
    """``ref`` written as a Docker archive (``ctr images import`` reads it) at ``path``."""
    path.unlink(missing_ok=True)
    buildah("push", "-q", ref, f"docker-archive:{path}:{ref}")
    return path


def files(ref: str) -> list[str]:
    """Every path in image ``ref`` (absolute, directories included)."""
    ctr = buildah("from", "--pull=never", ref)
    try:
        root = Path(buildah("mount", ctr))
        try:
            return sorted("/" + str(p.relative_to(root)) for p in root.rglob("*"))
        finally:
            buildah("umount", ctr)
    finally:
        buildah("rm", ctr)


def run(ref: str, *cmd: str) -> str:
    """Run ``cmd`` in a throwaway container of ``ref`` (buildah run, chroot isolation); its
    stdout."""
    ctr = buildah("from", "--pull=never", ref)
    try:
        return buildah("run", "--isolation", "chroot", ctr, "--", *cmd)
    finally:
        buildah("rm", ctr)


MPS_STANDIN = """#!/bin/sh
# Stand-in for NVIDIA's nvidia-cuda-mps-control (no GPU here): in the foreground (-f) it
# makes what the real daemon makes in CUDA_MPS_PIPE_DIRECTORY (the named pipe "control")
# and a log line in CUDA_MPS_LOG_DIRECTORY, then runs until stopped.
[ "$1" = "-f" ] || { echo "stand-in: only -f (foreground) is supported" >&2; exit 2; }
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
[ -p "$CUDA_MPS_PIPE_DIRECTORY/control" ] || mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control"
echo "stand-in MPS control daemon started" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
exec sleep infinity
"""
MPS_IMAGE = "localhost/gpufrac-test/mps-control-standin"


def mps_standin_image() -> str:
    """An image whose ``nvidia-cuda-mps-control`` is ``MPS_STANDIN`` (on the Python stand-in)."""
    ref = f"{MPS_IMAGE}:{_key(MPS_STANDIN, python_base())}"
    if exists(ref):
        return ref
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "nvidia-cuda-mps-control"
        script.write_text(MPS_STANDIN)
        ctr = buildah("from", python_base())
        try:
            buildah("copy", "--chmod", "0755", ctr, str(script), "/usr/local/bin/nvidia-cuda-mps-control")
            buildah("commit", "-q", ctr, ref)
        finally:
            buildah("rm", ctr)
    return ref
