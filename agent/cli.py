"""``gpufrac-agent`` command line: the node agent (NVML inventory publisher and device plugin)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from podspec.kubeio import kube_api
from podspec.version import installed_version


def _run(args: argparse.Namespace) -> int:
    import signal
    import threading

    import yaml

    from agent.metrics import AgentMetrics
    from agent.nvml import FakeNvml, NvmlBackend, NvmlUnavailable, PynvmlBackend
    from agent.publisher import Publisher, PublishOptions

    logging.basicConfig(level=args.log_level.upper())
    backend: NvmlBackend
    try:
        if args.nvml == "fake":
            cfg = yaml.safe_load(args.fake_config.read_text()) if args.fake_config else {}
            backend = FakeNvml.from_config({"node": args.node_name, **(cfg or {})})
        else:
            backend = PynvmlBackend()
    except NvmlUnavailable as exc:
        print(f"gpufrac-agent: {exc}", file=sys.stderr)
        return 3
    opts = PublishOptions(replicas=args.replicas, heartbeat_s=args.heartbeat_s,
                          min_interval_s=args.min_interval_s, proc_root=args.proc_root)
    # --once writes nothing, so it needs no API credentials either.
    publisher = Publisher(None if args.once else kube_api(args.kubeconfig), args.node_name, backend, opts)
    if args.once:
        print(publisher.inventory().model_dump_json(by_alias=True, indent=2))
        backend.close()
        return 0
    metrics = AgentMetrics(args.node_name, lambda: publisher.readings, publisher.health.unhealthy)
    publisher.metrics = metrics
    if args.metrics_port:
        try:
            metrics.serve(args.metrics_port, args.metrics_host)
        except OSError as exc:
            print(f"gpufrac-agent: cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}",
                  file=sys.stderr)
            return 2
        logging.getLogger("agent").info("metrics on http://%s:%d/metrics", args.metrics_host, args.metrics_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threads = []
    on_publish: list[Callable[[], object]] = []  # what follows each inventory write
    if args.device_plugin:
        from agent.deviceplugin.plugin import PluginServer, slots_of
        from agent.deviceplugin.stubs import StubsUnavailable, load
        from podspec.kubeio import response_json

        try:
            load()
        except StubsUnavailable as exc:
            print(f"gpufrac-agent: {exc} (or pass --no-device-plugin)", file=sys.stderr)
            return 3
        api = publisher.api
        node = args.node_name

        def pods() -> list[dict[str, Any]]:
            # Bounded: a slow API server fails the call (UNAVAILABLE) instead of holding it.
            items: list[dict[str, Any]] = response_json(api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _preload_content=False,
                _request_timeout=POD_LIST_TIMEOUT_S))["items"]
            return items

        plugin = PluginServer(lambda: slots_of(publisher.published()), pods, node, args.plugin_dir,
                              mps_pipe_dir=args.mps_pipe_dir,
                              on_allocate=lambda result: metrics.allocations.labels(result).inc(),
                              on_register=metrics.registrations.inc)
        on_publish.append(plugin.changed.set)
        threads.append(threading.Thread(target=plugin.run, args=(stop,), name="device-plugin"))
    if args.dra_driver:
        from agent.deviceplugin.stubs import StubsUnavailable, load
        from agent.dra.kubelet_plugin import DraDriver, DraPluginServer, claim_reader
        from agent.dra.slice_publisher import SlicePublisher

        try:
            for stubs in ("dra", "registration"):
                load(api=stubs)
        except StubsUnavailable as exc:
            print(f"gpufrac-agent: {exc} (or pass --no-dra-driver)", file=sys.stderr)
            return 3
        slices = SlicePublisher(publisher.api, args.node_name)
        on_publish.append(lambda: slices.publish(publisher.published()))

        def registered() -> None:  # kubelet may have deleted the slice when it started
            slices.invalidate()
            slices.publish(publisher.published())
        driver = DraDriver(args.node_name, claim_reader(publisher.api.api_client), publisher.published,
                           args.cdi_dir, args.mps_pipe_dir)
        dra = DraPluginServer(driver, args.dra_plugin_dir, args.dra_registry_dir, registered)
        threads.append(threading.Thread(target=dra.run, args=(stop,), name="dra-kubelet-plugin"))

    def after_publish() -> None:
        for changed in on_publish:
            changed()
    publisher.on_publish = after_publish
    for t in threads:
        t.start()
    try:
        publisher.run(stop)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        backend.close()
    return 0


POD_LIST_TIMEOUT_S = (3.0, 10.0)
"""Connect and read timeouts of the device plugin's LIST of the node's pods, seconds."""


def build_parser() -> argparse.ArgumentParser:
    """The agent's argument parser."""
    agent = argparse.ArgumentParser(prog="gpufrac-agent",
                                    description="node agent: publish this node's GPU inventory (NVML)",
                                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    agent.add_argument("--version", action="version", version=f"gpufrac-agent {installed_version()}")
    agent.add_argument("--node-name", required=True, help="this node (the DaemonSet passes spec.nodeName)")
    agent.add_argument("--kubeconfig", type=Path, help="in-cluster config when absent")
    agent.add_argument("--nvml", choices=("real", "fake"), default="real",
                       help="read GPUs through NVML (real) or from --fake-config (tests, no GPU)")
    agent.add_argument("--fake-config", type=Path, help="YAML {gpus: [{name, memory_mib, count}]} for --nvml fake")
    agent.add_argument("--time-slicing-replicas", "--replicas", dest="replicas", type=int, default=4,
                       help="time-slicing replicas per GPU: pods one GPU may hold at once (GFD label wins; "
                            "--replicas: its older name)")
    agent.add_argument("--heartbeat-s", type=float, default=60.0,
                       help="rewrite the inventory at least this often (the extender's staleness clock)")
    agent.add_argument("--min-interval-s", type=float, default=10.0,
                       help="write a changed inventory at most this often (XID health changes: at once)")
    agent.add_argument("--proc-root", type=Path, default=Path("/proc"),
                       help="the host's /proc (PIDs from NVML are host PIDs)")
    agent.add_argument("--device-plugin", action=argparse.BooleanOptionalAction, default=True,
                       help="serve the gpufrac.io/gpu device plugin to kubelet")
    agent.add_argument("--dra-driver", action=argparse.BooleanOptionalAction, default=False,
                       help="also be the DRA driver gpu.gpufrac.io: publish the node's GPUs as a ResourceSlice "
                            "and prepare claims for kubelet with CDI (docs/dra.md)")
    agent.add_argument("--dra-registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"),
                       help="kubelet's plugin registration directory (<kubelet root>/plugins_registry)")
    agent.add_argument("--dra-plugin-dir", type=Path, default=Path("/var/lib/kubelet/plugins/gpu.gpufrac.io"),
                       help="where the DRA service's socket goes (dra.sock)")
    agent.add_argument("--cdi-dir", type=Path, default=Path("/var/run/cdi"),
                       help="where prepared claims' CDI specs go (one the container runtime reads)")
    agent.add_argument("--plugin-dir", type=Path, default=Path("/var/lib/kubelet/device-plugins"),
                       help="kubelet's device-plugin directory (kubelet.sock)")
    agent.add_argument("--mps-pipe-dir", type=Path,
                       help="the node's MPS control daemon pipe directory (host path): mounted into "
                            "containers below a whole GPU, with CUDA_MPS_PIPE_DIRECTORY set; none: no MPS")
    agent.add_argument("--metrics-port", type=int, default=9402,
                       help="serve Prometheus /metrics on this port; 0 turns it off")
    agent.add_argument("--metrics-host", default="0.0.0.0",
                       help="address the metrics port binds")
    agent.add_argument("--once", action="store_true", help="print the inventory JSON and exit, write nothing")
    agent.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                       help="log level (default: info)")

    return agent


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpufrac-agent`` console script."""
    from kubernetes.config.config_exception import ConfigException

    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except ConfigException as exc:
        print(f"gpufrac-agent: no Kubernetes credentials: pass --kubeconfig, set $KUBECONFIG, or run in a "
              f"pod with a service account ({exc})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
