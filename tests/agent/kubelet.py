"""kubelet's side of the device-plugin API, for tests: its Registration service."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Any

import grpc


class FakeKubelet:
    """kubelet's Registration service on ``<dir>/kubelet.sock``."""

    def __init__(self, directory: Path, stubs: tuple[Any, Any]) -> None:
        self.directory, (self.pb, self.pb_grpc) = directory, stubs
        self.requests: list[Any] = []
        self.server: grpc.Server | None = None

    def start(self) -> None:
        pb, outer = self.pb, self

        # The servicer base comes from the gRPC stubs generated at run time: untyped.
        class Registration(self.pb_grpc.RegistrationServicer):  # type: ignore[misc,name-defined]
            def Register(self, request: Any, context: Any) -> Any:  # noqa: N802
                outer.requests.append(request)
                return pb.Empty()

        sock = self.directory / "kubelet.sock"
        if sock.exists():
            sock.unlink()
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        self.pb_grpc.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port(f"unix://{sock}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
