"""``gpufrac`` command line.

Settings are built here from the flags (and ``GPUFRAC_*`` environment variables), then
injected into the app: nothing reads configuration at import.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from podspec.cli_help import describe_subcommands
from podspec.kubeio import kube_api
from podspec.version import installed_version


def _serve(args: argparse.Namespace) -> int:
    from extender.admin_config import ConfigError
    from extender.app import create_app
    from extender.server import serve
    from extender.settings import Settings

    overrides = {k: v for k, v in {
        "mode": args.mode, "host": args.host, "port": args.port, "cluster_file": args.cluster_file,
        "config_file": args.config, "preset": args.preset, "kubeconfig": args.kubeconfig,
        "health_port": args.health_port, "health_host": args.health_host,
        "replicas_per_gpu": args.replicas_per_gpu, "log_level": args.log_level,
        "decision": args.decision,
        "inventory_stale_after_s": args.inventory_stale_after_s,
        "assume_ttl_s": args.assume_ttl_s, "config_poll_s": args.config_poll_s,
        "fence_namespace": args.fence_namespace, "claim_ttl_s": args.claim_ttl_s,
        "resource_claims": args.resource_claims or None, "allocate_claims": args.allocate_claims or None,
        "bind_api_timeout_s": args.bind_api_timeout_s,
        "scheduler_name": args.scheduler_name, "requeue_max_pods": args.requeue_max_pods,
        "stall_after_s": args.stall_after_s, "scheduler_lease": args.scheduler_lease,
        "scheduler_pod_selector": args.scheduler_pod_selector, "gpu_models_configmap": args.gpu_models_configmap,
        "tls_cert_file": args.tls_cert_file, "tls_key_file": args.tls_key_file,
        "tls_client_ca_file": args.tls_client_ca_file,
        "events_token": (args.events_token_file.read_text().strip() if args.events_token_file
                         else args.events_token),
        }.items() if v is not None}
    try:
        settings = Settings(**overrides)
        app = create_app(settings, kube_api=kube_api(settings.kubeconfig) if settings.mode == "cluster" else None)
    except (ConfigError, ValueError) as exc:
        print(f"gpufrac: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper())
    scheme = "https" if settings.tls_cert_file is not None else "http"
    logging.getLogger("extender").info(
        "gpufrac %s: verbs on %s://%s:%d%s%s", settings.mode, scheme, settings.host, settings.port,
        " (client certificates required)" if settings.tls_client_ca_file is not None else "",
        f"; health and metrics on http://{settings.health_host}:{settings.health_port}"
        if settings.health_port is not None else "")
    logging.getLogger("extender").info(
        "gpufrac config: %s", f"{settings.config_file} (reloaded on change)" if settings.config_file is not None
        else f"preset {settings.preset!r}, no admin config file (no tenants)")
    serve(app, settings)
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import time

    from extender import inspection
    from podspec.kubeio import response_json

    if args.url:
        if args.tenant or args.defrag and args.config:
            raise SystemExit("gpufrac inspect: --url reads what that gpufrac serves; --tenant and --config "
                             "read the API (use -n NS, or leave --url out)")
        api: Any = None
    else:
        api = kube_api(args.kubeconfig)
    namespaces: list[str] | None = list(args.namespace) if args.namespace else None
    if args.tenant:
        namespaces = [*(namespaces or []), *_tenant_namespaces(args, api)]

    if args.defrag and args.url:
        print(inspection.render_defrag(_read_url(args, "/defrag")))
        return 0
    if args.defrag:
        return _defrag(args, api)

    def once() -> str:
        if args.url:
            try:
                reports = inspection.served(_read_url(args, "/nodes"), _read_url(args, "/allocations"))
            except ValueError as exc:
                raise SystemExit(f"gpufrac inspect: {args.url}: {exc}") from None
            rejected = [(e.get("key", "?"), e.get("message", "")) for e in _read_url(args, "/quarantine")
                        if isinstance(e, dict) and e.get("kind") == "Pod"]
        else:
            nodes = response_json(api.list_node(_preload_content=False))["items"]
            pods = response_json(api.list_pod_for_all_namespaces(_preload_content=False))["items"]
            reports = inspection.gather(nodes, pods, stale_after_s=args.inventory_stale_after_s)
            rejected = inspection.rejected_pods(pods)
        reports = inspection.select(reports, args.node or (), namespaces)
        if args.json:
            return json.dumps([r.as_dict() for r in reports], indent=2)
        return inspection.render_table(reports, [(k, why) for k, why in rejected
                                                 if inspection.in_namespaces(k, namespaces)])

    if not args.watch:
        print(once())
        return 0
    shown = 0
    try:
        while args.max_refreshes is None or shown < args.max_refreshes:
            text = once()
            # kubectl's watch style: clear the terminal, print the table and when it was read
            print(("\033[H\033[2J" if sys.stdout.isatty() else "") + text
                  + f"\n\n(every {args.interval_s:g} s; Ctrl-C stops)", flush=True)
            shown += 1
            if args.max_refreshes is None or shown < args.max_refreshes:
                time.sleep(args.interval_s)
    except KeyboardInterrupt:
        pass
    return 0


def _defrag(args: argparse.Namespace, api: Any) -> int:
    """``gpufrac inspect --defrag``: the plan from the API's objects, with the scoring of
    ``--config`` (the default preset without it)."""
    from extender import inspection
    from extender.admin_config import ConfigError, load_admin_config
    from extender.cluster.defragmenter import plan_from_api
    from scoring.presets import PRESETS
    from scoring.scorer import build_scorer

    try:
        scoring = load_admin_config(args.config).scoring if args.config else PRESETS["default"]
    except (ConfigError, OSError) as exc:
        raise SystemExit(f"gpufrac inspect: invalid admin config: {exc}") from None
    made = plan_from_api(api, build_scorer(scoring), args.inventory_stale_after_s).as_dict()
    print(json.dumps(made, indent=2) if args.json else inspection.render_defrag(made))
    return 0


def _read_url(args: argparse.Namespace, path: str) -> Any:
    """GET ``path`` of the gpufrac at ``--url`` as JSON (HTTPS verified against ``--ca-file``
    when given, else the system's CAs); exits with the endpoint's own ``Error`` on a 4xx/5xx."""
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(args.ca_file)) if args.ca_file else None
    url = args.url.rstrip("/") + path
    try:
        with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        try:
            why = json.loads(exc.read()).get("Error") or exc.reason
        except (ValueError, AttributeError):
            why = exc.reason
        raise SystemExit(f"gpufrac inspect: {url}: HTTP {exc.code}: {why}") from None
    except (OSError, ValueError) as exc:  # unreachable, TLS, not JSON
        raise SystemExit(f"gpufrac inspect: {url}: {exc}") from None


def _tenant_namespaces(args: argparse.Namespace, api: Any) -> list[str]:
    """The namespaces the admin config (``--config``) gives tenant ``args.tenant``, plus those
    labelled with its ``tenant_label``."""
    from extender.admin_config import ConfigError, load_admin_config

    if args.config is None:
        raise SystemExit("gpufrac inspect: --tenant needs --config (the admin config that defines tenants)")
    try:
        tenants = load_admin_config(args.config).tenants
    except ConfigError as exc:
        raise SystemExit(f"gpufrac inspect: invalid admin config: {exc}") from None
    if args.tenant not in tenants.by_name:
        raise SystemExit(f"gpufrac inspect: no tenant {args.tenant!r} in {args.config} "
                         f"(tenants: {', '.join(sorted(tenants.by_name)) or 'none'})")
    found = [ns for ns, t in tenants.by_namespace.items() if t.name == args.tenant]
    if tenants.label_key:
        from podspec.kubeio import response_json

        listed = response_json(api.list_namespace(
            label_selector=f"{tenants.label_key}={args.tenant}", _preload_content=False))["items"]
        found += [n["metadata"]["name"] for n in listed]
    return found


def _demo(args: argparse.Namespace) -> int:
    from extender.demo import run

    return run()


def _schema(args: argparse.Namespace) -> int:
    from podspec.annotations import inventory_json_schema

    print(json.dumps(inventory_json_schema(), indent=2))
    return 0


def _config_schema(args: argparse.Namespace) -> int:
    from extender.admin_config import config_json_schema

    schema = config_json_schema()
    if args.values_schema is None:
        print(json.dumps(schema, indent=2))
        return 0
    values = json.loads(args.values_schema.read_text())
    values["$defs"] = schema.pop("$defs")
    values["properties"]["config"] = schema
    args.values_schema.write_text(json.dumps(values, indent=2) + "\n")
    print(f"{args.values_schema}: config schema written")
    return 0


def _helm_config_value(path: Path) -> str | None:
    """The ``config`` value of a Helm values file, as admin config YAML; None when the file
    sets no ``config`` (the chart's default applies).

    Raises
    ------
    ConfigError
        Unreadable file, invalid YAML, or no ``config`` mapping in it.
    """
    import yaml

    from extender.admin_config import ConfigError

    try:
        values = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if values is None or isinstance(values, dict) and "config" not in values:
        return None
    config = values.get("config") if isinstance(values, dict) else values
    if not isinstance(config, dict):
        kind = {type(None): "null", str: "a string", list: "a list", int: "a number", float: "a number",
                bool: "true or false"}.get(type(config), "not a mapping")
        where = "config" if isinstance(values, dict) else "the file"
        raise ConfigError(f"{where}: must be a mapping (the admin config, docs/admin.md), not {kind}")
    return str(yaml.safe_dump(config))


def _config_validate(args: argparse.Namespace) -> int:
    """Validate an admin config file as ``serve`` would; print the effective weights."""
    from extender.admin_config import ConfigError, load_admin_config, parse_admin_config
    from scoring.scorer import build_scorer

    try:
        if args.helm_values:
            text = _helm_config_value(args.file)
            if text is None:
                print(f"{args.file}: no `config:` value: the chart's default admin config applies")
                return 0
            policy = parse_admin_config(text, f"{args.file} (its config value)")
        else:
            policy = load_admin_config(args.file)
        build_scorer(policy.scoring)
    except (ConfigError, ValueError) as exc:
        print(f"gpufrac: {args.file}: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    config = policy.scoring
    weights = {k: v for k, v in config.weights.items() if v}
    print(f"{args.file}: valid")
    print("weights: " + ", ".join(f"{k}={v:g}" for k, v in sorted(weights.items())))
    for qos, over in sorted(config.qos_overrides.items()):
        print(f"{qos}: " + ", ".join(f"{k}={v:g}" for k, v in sorted(over.items())))
    print(f"qos: isolate_guaranteed={config.qos.isolate_guaranteed}, "
          f"best_effort_cap_milli={config.qos.best_effort_cap_milli}")
    print(f"learning: learn_from={config.learning.learn_from}, half_life_pods={config.learning.half_life_pods}")
    tol = policy.tolerance
    print(f"tolerance: workload={tol.workload:g}"
          + "".join(f", {name}={bound:g}" for name, bound in sorted(tol.terms.items())))
    tenants = policy.tenants
    for name, tenant in sorted(tenants.by_name.items()):
        listed = [ns for ns, t in tenants.by_namespace.items() if t is tenant]
        print(f"tenant {name}: namespaces={','.join(listed) or '-'}"
              f"{' (and every other namespace: default_tenant)' if tenant is tenants.default else ''} "
              f"qos_ceiling={tenant.qos_ceiling.wire_name} quota_gpu_milli={tenant.quota_gpu_milli} "
              f"quota_gpu_memory_mib={tenant.quota_gpu_memory_mib}")
    if tenants.label_key:
        print(f"tenant_label: namespaces labelled {tenants.label_key}=<tenant name>")
    return 0


DESCRIPTION = ("gpufrac: a Kubernetes scheduler extender for fractional GPU placement. kube-scheduler "
               "calls 'gpufrac serve' over the extender protocol (filter, prioritize, bind, preempt).")
NO_CREDENTIALS = ("gpufrac: no Kubernetes credentials: pass --kubeconfig, set $KUBECONFIG (or have "
                  "~/.kube/config), or run in a pod with a service account")


def _default(field: str) -> str:
    """``(default X)`` of a ``Settings`` field, for the help texts."""
    from extender.settings import Settings

    return f"(default {Settings.model_fields[field].default})"


def build_parser(prog: str = "gpufrac") -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"gpufrac {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the extender (standalone: nodes from a file; cluster: the API)")
    serve.add_argument("--mode", choices=("standalone", "cluster"),
                       help=f"standalone: nodes from --cluster-file, pods from pod-event posts; cluster: "
                            f"nodes and pods from the API {_default('mode')}")
    serve.add_argument("--kubeconfig", type=Path, help="cluster mode: kubeconfig file (default $KUBECONFIG "
                       "or ~/.kube/config; in a pod, its service account)")
    serve.add_argument("--inventory-stale-after-s", type=float,
                       help=f"a node whose inventory heartbeat is older gets no GPU pods "
                            f"{_default('inventory_stale_after_s')}")
    serve.add_argument("--assume-ttl-s", type=float,
                       help=f"seconds a bind's allocation is held until the pod watch shows it "
                            f"{_default('assume_ttl_s')}")
    serve.add_argument("--fence-namespace", help="cluster mode: fence binds with per-node claim ledgers "
                       "in this namespace (needed for more than one replica)")
    serve.add_argument("--resource-claims", action="store_true",
                       help="cluster mode: also count the shares ResourceClaims hold of gpu.gpufrac.io (DRA)")
    serve.add_argument("--allocate-claims", action="store_true",
                       help="cluster mode: allocate pods' ResourceClaims of gpu.gpufrac.io to the GPUs gpufrac "
                            "chooses (a profile without DynamicResources; implies --resource-claims)")
    serve.add_argument("--claim-ttl-s", type=float, help="cluster mode, fenced: seconds a claim counts (60)")
    serve.add_argument("--bind-api-timeout-s", type=float,
                       help=f"cluster mode: limit of each API call of a bind, seconds, below kube-scheduler's "
                            f"httpTimeout {_default('bind_api_timeout_s')}")
    serve.add_argument("--decision", choices=("filter", "prioritize"),
                       help="filter: filter returns only the chosen node (kube-scheduler skips scoring); "
                            f"prioritize: every feasible node passes, prioritize ranks {_default('decision')}")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                       help=f"log level {_default('log_level')}")
    serve.add_argument("--scheduler-name",
                       help=f"cluster mode: the kube-scheduler profile that calls gpufrac (its pending pods are "
                            f"requeued when GPU share is freed; $GPUFRAC_SCHEDULER_NAME) {_default('scheduler_name')}")
    serve.add_argument("--requeue-max-pods", type=int,
                       help=f"cluster mode: pending GPU pods requeued per release of GPU share, 0 turns requeueing "
                            f"off ($GPUFRAC_REQUEUE_MAX_PODS) {_default('requeue_max_pods')}")
    serve.add_argument("--stall-after-s", type=float,
                       help=f"cluster mode: report pending GPU pods of --scheduler-name that no scheduler has "
                            f"attempted for this long (/readyz, a metric, the log, an Event) "
                            f"{_default('stall_after_s')}")
    serve.add_argument("--scheduler-lease", metavar="NAMESPACE/NAME",
                       help="cluster mode: the Lease kube-scheduler elects its leader with; a stall report "
                            "names its holder (unset: not read)")
    serve.add_argument("--scheduler-pod-selector", metavar="SELECTOR",
                       help="cluster mode: label selector of the release's kube-scheduler pods in the Lease's "
                            "namespace (is the holder one of them?)")
    serve.add_argument("--gpu-models-configmap", metavar="NAMESPACE/NAME",
                       help="cluster mode: write the nodes' GPU models to this ConfigMap, which the admission "
                            "policy reads to refuse unknown gpufrac.io/gpu-model names (unset: not written)")
    serve.add_argument("--host", help=f"address of the verb listener {_default('host')}")
    serve.add_argument("--port", type=int, help=f"port of the verb listener {_default('port')}")
    serve.add_argument("--health-port", type=int,
                       help="also serve /healthz, /readyz and /metrics (only) over plain HTTP on this port")
    serve.add_argument("--health-host", help="address of the --health-port listener (default 0.0.0.0)")
    serve.add_argument("--cluster-file", type=Path, help="node list, YAML or openb CSV")
    serve.add_argument("--config", type=Path, help="admin config file (scoring weights)")
    serve.add_argument("--preset", help=f"weight preset when no config file is given {_default('preset')}")
    serve.add_argument("--replicas-per-gpu", type=int,
                       help=f"standalone mode: time-slicing replicas per GPU {_default('replicas_per_gpu')}")
    serve.add_argument("--config-poll-s", type=float,
                       help=f"seconds between two reads of --config {_default('config_poll_s')}")
    serve.add_argument("--tls-cert-file", type=Path, help="serve HTTPS with this certificate (PEM)")
    serve.add_argument("--tls-key-file", type=Path, help="the certificate's private key (PEM)")
    serve.add_argument("--tls-client-ca-file", type=Path,
                       help="require client certificates signed by this CA (only kube-scheduler)")
    serve.add_argument("--events-token", help="standalone mode: the pod-events bearer token (visible in "
                       "the process list: prefer --events-token-file or $GPUFRAC_EVENTS_TOKEN)")
    serve.add_argument("--events-token-file", type=Path,
                       help="standalone mode: open /standalone/pod-events to callers presenting this "
                            "file's token as 'Authorization: Bearer <token>' (or $GPUFRAC_EVENTS_TOKEN); "
                            "off when neither is set")
    serve.set_defaults(func=_serve)

    ins = sub.add_parser("inspect", help="table of nodes, GPUs and the pods on them, read from the API "
                                          "or, with --url, from a running gpufrac (also: kubectl gpufrac inspect)")
    ins.add_argument("--url", help="read this running gpufrac instead of the API (its /nodes, /allocations, "
                                   "/quarantine, /defrag), e.g. http://127.0.0.1:8888 for a standalone one")
    ins.add_argument("--ca-file", type=Path, help="with an https --url: the CA that signed gpufrac's certificate")
    ins.add_argument("--kubeconfig", type=Path,
                     help="kubeconfig file (default $KUBECONFIG or ~/.kube/config; in a pod, its service account)")
    ins.add_argument("--json", action="store_true", help="JSON instead of the table")
    ins.add_argument("--node", action="append", metavar="NAME", help="only this node (repeatable)")
    ins.add_argument("-n", "--namespace", action="append", metavar="NS",
                     help="only GPUs holding pods of this namespace, and only those pods (repeatable)")
    ins.add_argument("--tenant", help="only GPUs holding pods of this tenant's namespaces (needs --config)")
    ins.add_argument("--config", type=Path, help="the admin config that defines --tenant's namespaces "
                                                 "(and, with --defrag, the scoring)")
    ins.add_argument("--defrag", action="store_true",
                     help="the defragmentation plan instead: which running pods to move so that pods waiting "
                          "for fragmentation fit (read from the API; nothing is changed)")
    ins.add_argument("-w", "--watch", action="store_true", help="read and print again every --interval-s")
    ins.add_argument("--interval-s", type=float, default=2.0, help="--watch period (default 2.0)")
    ins.add_argument("--max-refreshes", type=int, help=argparse.SUPPRESS)  # bounds --watch in tests
    ins.add_argument("--inventory-stale-after-s", type=float, default=180.0,
                     help="mark nodes whose inventory heartbeat is older (default 180.0)")
    ins.set_defaults(func=_inspect)

    cfg = sub.add_parser("config", help="admin config file tools")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    val = cfg_sub.add_parser("validate", help="check an admin config file (exit 2 with field paths if invalid)")
    val.add_argument("file", type=Path)
    val.add_argument("--helm-values", action="store_true",
                     help="FILE is a Helm values file: check its `config` value (what helm upgrade -f installs)")
    val.set_defaults(func=_config_validate)
    cs = cfg_sub.add_parser("schema", help="print the admin config file's JSON Schema (editors, CI checks)")
    cs.add_argument("--values-schema", type=Path, metavar="FILE",
                    help="instead, write it as the `config` value of a Helm values.schema.json (the chart's "
                         "deploy/helm/gpufrac/values.schema.json), keeping the file's other values")
    cs.set_defaults(func=_config_schema)

    demo = sub.add_parser("demo", help="a first look in seconds: an extender with three example nodes "
                                        "places ten pods over HTTP and prints the inspect table")
    demo.set_defaults(func=_demo)

    sch = sub.add_parser("inventory-schema", help="print the gpufrac.io/inventory v1 JSON Schema")
    sch.set_defaults(func=_schema)
    describe_subcommands(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "gpufrac") -> int:
    """Entry point of the ``gpufrac`` console script."""
    from kubernetes.config.config_exception import ConfigException

    args = build_parser(prog).parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigException as exc:
        print(f"{NO_CREDENTIALS} ({exc})", file=sys.stderr)
        return 2
    except BrokenPipeError:  # a reader that stopped early (``| head``): no traceback (Python's recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kubectl-gpufrac``: kubectl runs it for ``kubectl gpufrac ...``."""
    return main(argv, prog="kubectl gpufrac")


if __name__ == "__main__":
    raise SystemExit(main())
