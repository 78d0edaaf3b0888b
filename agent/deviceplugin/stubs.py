"""gRPC stubs of kubelet's device-plugin API v1beta1, generated from the upstream proto.

The proto is not copied into the project: ``generate`` fetches the ``k8s.io/kubelet`` Go
module (``go mod download``), takes ``pkg/apis/deviceplugin/v1beta1/api.proto`` from it and
runs ``grpc_tools.protoc`` into ``agent/deviceplugin/_v1beta1/`` (git-ignored). The
tests generate it on first use; an image build runs ``python -m
agent.deviceplugin.stubs`` in a stage with Go.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

KUBELET_MODULE = "k8s.io/kubelet@v0.36.3"
"""The Go module the proto comes from (same release as the control plane the tests run)."""
PROTO_PATH = "pkg/apis/deviceplugin/v1beta1/api.proto"
OUT = Path(__file__).resolve().parent / "_v1beta1"


class StubsUnavailable(RuntimeError):
    """The stubs are not generated and cannot be (no Go, no grpcio-tools)."""


def generate(out: Path = OUT) -> Path:
    """Generate ``api_pb2.py`` and ``api_pb2_grpc.py`` into ``out`` (a package).

    Raises
    ------
    StubsUnavailable
        When ``go`` or ``grpc_tools`` is missing or a step fails (its output included).
    """
    go = shutil.which("go")
    if go is None:
        raise StubsUnavailable("go is needed to fetch k8s.io/kubelet's api.proto")
    try:
        from grpc_tools import protoc
    except ImportError:
        raise StubsUnavailable("grpcio-tools is needed to generate the device-plugin stubs") from None
    proc = subprocess.run([go, "mod", "download", "-json", KUBELET_MODULE], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StubsUnavailable(f"go mod download {KUBELET_MODULE} failed:\n{proc.stdout}{proc.stderr}")
    proto = Path(json.loads(proc.stdout)["Dir"]) / PROTO_PATH
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "api.proto"
        shutil.copyfile(proto, src)
        well_known = Path(protoc.__file__).parent / "_proto"
        rc = protoc.main(["grpc_tools.protoc", f"-I{tmp}", f"-I{well_known}",
                          f"--python_out={tmp}", f"--grpc_python_out={tmp}", str(src)])
        if rc != 0:
            raise StubsUnavailable(f"protoc failed on {proto} (exit {rc})")
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(tmp) / "api_pb2.py", out / "api_pb2.py")
        grpc_py = (Path(tmp) / "api_pb2_grpc.py").read_text()
        # protoc writes a top-level import; inside a package it must be relative.
        (out / "api_pb2_grpc.py").write_text(grpc_py.replace("import api_pb2 as", "from . import api_pb2 as"))
    (out / "__init__.py").write_text(f'"""Generated from {KUBELET_MODULE} {PROTO_PATH}; do not edit."""\n')
    return out


def load(generate_if_missing: bool = False) -> tuple[ModuleType, ModuleType]:
    """``(api_pb2, api_pb2_grpc)``; generate them first if asked and missing.

    Raises
    ------
    StubsUnavailable
        When they are missing (and cannot be generated).
    """
    if not (OUT / "api_pb2_grpc.py").exists():
        if not generate_if_missing:
            raise StubsUnavailable("device-plugin stubs not generated: run "
                                   "`python -m agent.deviceplugin.stubs` (needs Go)")
        generate()
    pkg = __package__ + "._v1beta1"
    return importlib.import_module(pkg + ".api_pb2"), importlib.import_module(pkg + ".api_pb2_grpc")


if __name__ == "__main__":
    print(generate(), file=sys.stderr)  # noqa: T201
