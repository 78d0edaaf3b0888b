"""Write ``extender/cluster/kube-core-v1.binpb``: the protobuf descriptors of the Pod watch.

    python deploy/kube_protos.py     # from the repository root; needs Go and grpcio-tools

The extender's pod watch reads the API server's protobuf encoding
(``extender.cluster.protobuf_watch``). Its message types are those of ``k8s.io/api``'s
``core/v1/generated.proto`` and the ``k8s.io/apimachinery`` protos it imports, at
``API_VERSION`` (the release of the control plane the tests run). This fetches the two Go
modules (``go mod download``), lays them out under their import paths and runs
``grpc_tools.protoc --include_imports --descriptor_set_out`` on ``core/v1`` and ``meta/v1``:
one ``FileDescriptorSet`` (about 66 KB), loaded at run time into a ``DescriptorPool``, so no
generated Python module (their ``k8s.io`` paths are not importable names) and no Go at
install time. ``tests/deploy/test_kube_protos.py`` regenerates it and compares.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "extender" / "cluster" / "kube-core-v1.binpb"
API_VERSION = "v0.36.3"
"""The release of ``k8s.io/api`` and ``k8s.io/apimachinery`` the descriptors come from."""
PROTOS = ("k8s.io/api/core/v1/generated.proto", "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto")
"""The protos compiled (with every proto they import)."""


def module_dir(module: str) -> Path:
    """The Go module cache's directory of ``module@API_VERSION`` (downloaded if missing).

    Raises
    ------
    RuntimeError
        When ``go`` is missing or the download fails (its output included).
    """
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("go is needed to fetch the Kubernetes API protos")
    proc = subprocess.run([go, "mod", "download", "-json", f"{module}@{API_VERSION}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"go mod download {module}@{API_VERSION} failed:\n{proc.stdout}{proc.stderr}")
    return Path(json.loads(proc.stdout)["Dir"])


def generate(out: Path = OUT) -> Path:
    """Write the descriptor set to ``out``; returns ``out``.

    Raises
    ------
    RuntimeError
        When Go or grpcio-tools is missing, or a step fails.
    """
    try:
        from grpc_tools import protoc
    except ImportError:
        raise RuntimeError("grpcio-tools is needed to compile the Kubernetes API protos") from None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "k8s.io"
        root.mkdir()
        for name in ("api", "apimachinery"):
            (root / name).symlink_to(module_dir(f"k8s.io/{name}"))
        rc = protoc.main(["grpc_tools.protoc", f"-I{tmp}", "--include_imports",
                          f"--descriptor_set_out={out}", *PROTOS])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {', '.join(PROTOS)} (exit {rc})")
    return out


if __name__ == "__main__":
    sys.stdout.write(f"{generate()}: {OUT.stat().st_size} bytes\n")
