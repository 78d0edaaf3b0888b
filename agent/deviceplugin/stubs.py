"""gRPC stubs of kubelet's plugin APIs, generated from the upstream protos.

Three APIs, each from ``k8s.io/kubelet`` at ``KUBELET_MODULE`` (``API``): the device-plugin
API v1beta1 (``agent/deviceplugin/_v1beta1/``), the DRA kubelet plugin API v1
(``agent/dra/_v1/``) and the plugin registration API v1 (``agent/dra/_registration/``). The
protos are not copied into the project: ``generate`` fetches the Go module (``go mod
download``), takes each ``api.proto`` from it and runs ``grpc_tools.protoc`` into its package
(git-ignored). The tests generate them on first use; an image build runs ``python -m
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
"""The Go module the protos come from (same release as the control plane the tests run)."""
AGENT = Path(__file__).resolve().parent.parent
API = {
    "deviceplugin": ("pkg/apis/deviceplugin/v1beta1/api.proto", "agent.deviceplugin._v1beta1"),
    "dra": ("pkg/apis/dra/v1/api.proto", "agent.dra._v1"),
    "registration": ("pkg/apis/pluginregistration/v1/api.proto", "agent.dra._registration"),
}
"""API name -> (proto path in the module, package the stubs go to)."""
PROTO_PATH, _PACKAGE = API["deviceplugin"]
OUT = AGENT.parent / _PACKAGE.replace(".", "/")


class StubsUnavailable(RuntimeError):
    """The stubs are not generated and cannot be (no Go, no grpcio-tools)."""


def _out(api: str) -> Path:
    return AGENT.parent / API[api][1].replace(".", "/")


def generate(apis: tuple[str, ...] = tuple(API)) -> list[Path]:
    """Generate ``api_pb2.py`` and ``api_pb2_grpc.py`` of each of ``apis`` into its package.

    Returns
    -------
    list of Path
        The packages written.

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
        raise StubsUnavailable("grpcio-tools is needed to generate the kubelet plugin stubs") from None
    proc = subprocess.run([go, "mod", "download", "-json", KUBELET_MODULE], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StubsUnavailable(f"go mod download {KUBELET_MODULE} failed:\n{proc.stdout}{proc.stderr}")
    module_dir = Path(json.loads(proc.stdout)["Dir"])
    written = []
    for api in apis:
        proto_path, _package = API[api]
        proto, out = module_dir / proto_path, _out(api)
        # Each proto keeps its own path (kubelet/<api>/<version>/api.proto): protobuf's
        # descriptor pool holds one file per name, and all three are named api.proto upstream.
        rel = Path("kubelet", *Path(proto_path).parts[2:])
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / rel
            src.parent.mkdir(parents=True)
            shutil.copyfile(proto, src)
            well_known = Path(protoc.__file__).parent / "_proto"
            rc = protoc.main(["grpc_tools.protoc", f"-I{tmp}", f"-I{well_known}",
                              f"--python_out={tmp}", f"--grpc_python_out={tmp}", str(src)])
            if rc != 0:
                raise StubsUnavailable(f"protoc failed on {proto} (exit {rc})")
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src.parent / "api_pb2.py", out / "api_pb2.py")
            grpc_py = (src.parent / "api_pb2_grpc.py").read_text()
            # protoc imports the messages by their path; inside our package it must be relative.
            absolute = f"from {'.'.join(rel.parent.parts)} import api_pb2 as"
            if absolute not in grpc_py:
                raise StubsUnavailable(f"protoc's {rel.parent}/api_pb2_grpc.py does not import its messages as expected")
            (out / "api_pb2_grpc.py").write_text(grpc_py.replace(absolute, "from . import api_pb2 as"))
        (out / "__init__.py").write_text(f'"""Generated from {KUBELET_MODULE} {proto_path}; do not edit."""\n')
        written.append(out)
    return written


def load(generate_if_missing: bool = False, api: str = "deviceplugin") -> tuple[ModuleType, ModuleType]:
    """``(api_pb2, api_pb2_grpc)`` of ``api`` (a key of ``API``); generate them first if
    asked and missing.

    Raises
    ------
    StubsUnavailable
        When they are missing (and cannot be generated).
    """
    if not (_out(api) / "api_pb2_grpc.py").exists():
        if not generate_if_missing:
            raise StubsUnavailable(f"{api} stubs not generated: run "
                                   "`python -m agent.deviceplugin.stubs` (needs Go)")
        generate()
    pkg = API[api][1]
    return importlib.import_module(pkg + ".api_pb2"), importlib.import_module(pkg + ".api_pb2_grpc")


if __name__ == "__main__":
    print(*generate(), sep="\n", file=sys.stderr)  # noqa: T201
