"""gpufrac's images as ``deploy/Dockerfile`` builds them (buildah, stand-in bases): they run,
and they hold the product and its dependencies only.

What an image must not contain: the repository's tests, harness, benchmarks and traces, the
Dockerfile's source tree, a compiler or the Go toolchain of the stubs stage. The extender
image carries no NVML or gRPC (the layer rule ``the extender imports no NVML or gRPC``
holds for the install too).
"""

from __future__ import annotations

import re

import pytest

from harness import images as img
from harness.builds import kube_version
from harness.processes import ROOT
from tests.e2e.conftest import Images

pytestmark = pytest.mark.e2e

SITE = re.compile(r"^/usr/(local/)?lib/python3\.11/(site|dist)-packages/")
TRACES = re.compile(r"/traces/|openb_(pod|node)_list")
COMPILERS = re.compile(r"/(bin|libexec/gcc/[^/]+/[^/]+)/(gcc|g\+\+|cc|c\+\+|cc1|clang|go|gofmt|rustc)(-[\d.]+)?$")


def forbidden(paths: list[str]) -> list[str]:
    """The paths of an image that break the rule above."""
    bad = []
    for p in paths:
        top = SITE.sub("", p).split("/", 1)[0] if SITE.match(p) else None
        if (top in {"tests", "benchmarks", "harness"} or p.startswith(("/src/", "/usr/local/go/"))
                or TRACES.search(p) or COMPILERS.search(p)):
            bad.append(p)
    return bad


@pytest.mark.parametrize("role", ["extender", "agent"])
def test_role_images_hold_the_product_only(images: Images, role: str) -> None:
    ref = getattr(images, role)
    paths = img.files(ref)
    assert len(paths) > 1000, "the scan read the image"  # a real root filesystem, not an empty mount
    assert forbidden(paths) == []
    products = {SITE.sub("", p).split("/", 1)[0] for p in paths if SITE.match(p)}
    assert {"scoring", "extender", "podspec", "agent"} <= products
    has_grpc = any(SITE.sub("", p).startswith(("grpc/", "pynvml.py")) for p in paths if SITE.match(p))
    assert has_grpc == (role == "agent")
    # The scan itself finds what it looks for (a check that cannot fail is no check).
    assert forbidden(["/usr/local/lib/python3.11/site-packages/benchmarks/replay.py", "/usr/bin/gcc-12",
                      "/src/agent/x.py", "/usr/local/go/bin/go",
                      "/data/openb_pod_list_default.csv"]) != []


def test_extender_image_runs_gpufrac_as_non_root(images: Images) -> None:
    out = img.run(images.extender, "sh", "-c", "id -u; gpufrac --version; gpufrac config validate --help")
    uid, version, *help_text = out.splitlines()
    assert uid == "65532"
    assert version == "gpufrac 0.1.0"
    assert "usage: gpufrac config validate" in "\n".join(help_text)


def test_extender_image_compiles_the_scoring_kernels(images: Images) -> None:
    # numba and llvmlite load on the image's base and compile as its user, with nowhere to
    # keep the result (decision 0032); the version is the lock's.
    lock = (ROOT / "deploy" / "requirements" / "extender.txt").read_text()
    version = re.search(r"^numba==(\S+)$", lock, re.MULTILINE)
    assert version is not None
    out = img.run(images.extender, "python3", "-c", "from extender.compiled import jit, kernels; "
                  "print(jit.CACHE, kernels().backend)")
    assert out.splitlines()[-1] == f"False numba {version.group(1)}"


def test_agent_image_carries_the_kubelet_plugin_stubs(images: Images) -> None:
    out = img.run(images.agent, "sh", "-c", "gpufrac-agent --version; python -c 'import agent.deviceplugin.stubs "
                  "as s; pb, grpc = s.load(); print(pb.DESCRIPTOR.package, grpc.RegistrationStub.__name__); "
                  "[print(s.load(api=a)[0].DESCRIPTOR.package) for a in (\"dra\", \"registration\")]'")
    # The device plugin's, and the DRA driver's (kubelet's DRA service and plugin registration).
    assert out.splitlines() == ["gpufrac-agent 0.1.0", "v1beta1 RegistrationStub", "k8s.io.kubelet.pkg.apis.dra.v1",
                                "pluginregistration"]


def test_scheduler_image_is_the_harness_release(images: Images) -> None:
    assert img.run(images.scheduler, "kube-scheduler", "--version") == f"Kubernetes {kube_version()}"


def _freeze(ref: str) -> dict[str, str]:
    """``pip list`` of an image: canonical name -> version."""
    from packaging.utils import canonicalize_name

    out = img.run(ref, "python3", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check")
    return {canonicalize_name(n): v for n, v in (line.split("==") for line in out.splitlines() if "==" in line)}


@pytest.mark.parametrize("role", ["extender", "agent"])
def test_images_install_exactly_the_lock(images: Images, role: str) -> None:
    # Issue 53: two builds must install the same dependency set. Every package of the lock is
    # in the image at its version, and the image adds nothing else to what the base has.
    from packaging.utils import canonicalize_name

    lock = {canonicalize_name(n): v for n, v in (
        line.split("==") for line in (ROOT / "deploy" / "requirements" / f"{role}.txt").read_text().splitlines()
        if line and not line.startswith("#"))}
    installed, base = _freeze(getattr(images, role)), _freeze(img.python_base())
    assert {n: installed.get(n) for n in lock} == lock
    assert installed["gpufrac"] == "0.1.0"
    assert set(installed) - set(lock) - {"gpufrac"} <= set(base), set(installed) - set(lock) - set(base)


def test_one_command_builds_both_images_and_packages_the_chart() -> None:
    """docs/install.md's deploy/release.sh, as written, with a local registry name."""
    registry = "localhost/gpufrac-release"
    package = ROOT / "dist" / "gpufrac-0.1.0.tgz"
    had_dist = package.parent.exists()
    package.unlink(missing_ok=True)
    refs = [f"{registry}/gpufrac:0.1.0", f"{registry}/gpufrac-agent:0.1.0"]
    try:
        out = img.release(registry)
        assert out.strip().splitlines()[-1] == f"images: {refs[0]} {refs[1]}; chart: dist/gpufrac-0.1.0.tgz"
        assert all(img.exists(ref) for ref in refs) and package.stat().st_size > 10_000
        assert img.run(refs[0], "gpufrac", "--version") == "gpufrac 0.1.0"
        assert img.run(refs[1], "gpufrac-agent", "--version") == "gpufrac-agent 0.1.0"
    finally:
        package.unlink(missing_ok=True)
        if not had_dist and package.parent.exists() and not any(package.parent.iterdir()):
            package.parent.rmdir()
        for ref in refs:
            img.buildah_may_fail("rmi", ref)
