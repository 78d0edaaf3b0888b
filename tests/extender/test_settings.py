"""The admin config file: presets, overrides, field-path errors; start-up refuses bad config."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.admin_config import ConfigError, ToleranceFile, load_admin_config, scoring_config
from extender.cli import main
from scoring.drift import DEFAULT_TOLERANCE, Tolerance
from scoring.presets import PRESETS
from scoring.registry import STRATEGIES
from scoring.scorer import Ties
from scoring.shape_prior import ShapePrior


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpufrac.yaml"
    path.write_text(text)
    return path


def test_override_on_top_of_preset(tmp_path: Path) -> None:
    cfg = load_admin_config(write(tmp_path, "scoring:\n  preset: default\n  weights:\n    spread: 0.5\n"
                                            "  qos_overrides:\n    best-effort: {node_packing: 3}\n")).scoring
    assert cfg.weights == {**PRESETS["default"].weights, "spread": 0.5}
    assert cfg.qos_overrides == {"best-effort": {"node_packing": 3.0}}


@pytest.mark.parametrize(("text", "message"), [
    ("scoring:\n  weights:\n    gpu_best_fit: -2\n", "scoring.weights.gpu_best_fit: must be a finite number >= 0"),
    ("scoring:\n  weights:\n    bogus: 1\n", "scoring.weights.bogus: unknown strategy"),
    ("scoring:\n  weights:\n    spread: lots\n", "scoring.weights.spread: Input should be a valid number"),
    ("scoring:\n  preset: fastest\n", "scoring.preset: unknown preset 'fastest'"),
    ("scoring:\n  wieghts: {}\n", "scoring.wieghts: unknown key; did you mean 'weights'?"),
    ("scoring: [\n", "gpufrac.yaml"),
    ("scoring:\n  tolerance: {workload: 1.5}\n", "scoring.tolerance.workload: Input should be less than or equal to 1"),
    ("scoring:\n  tolerance: {cpu_pressure: -0.1}\n", "scoring.tolerance.cpu_pressure: Input should be greater than"),
    ("scoring:\n  tolerance: {cpu_pressure: .nan}\n", "scoring.tolerance.cpu_pressure: Input should be a finite number"),
    ("scoring:\n  tolerance: {worklaod: 0.1}\n", "scoring.tolerance.worklaod: unknown key; did you mean 'workload'?"),
    ("scoring:\n  prior: {floor: 0.9}\n", "scoring.prior.floor: Input should be less than or equal to 0.5"),
    ("scoring:\n  prior: {pods: -1}\n", "scoring.prior.pods: Input should be greater than or equal to 0"),
    ("scoring:\n  prior:\n    shapes: [{gpus: 4, fraction: 0.5}]\n",
     "scoring.prior.shapes.0: Value error, a pod of 4 GPUs takes whole GPUs"),
    ("scoring:\n  prior:\n    shapes: [{gpus: 65}]\n", "scoring.prior.shapes.0.gpus: Input should be less than or equal to 64"),
    ("scoring:\n  prior:\n    shapes: [{fraction: 0}]\n", "scoring.prior.shapes.0.fraction: Input should be greater than 0"),
    ("scoring:\n  prior: {shapse: []}\n", "scoring.prior.shapse: unknown key; did you mean 'shapes'?"),
    ("scoring:\n  ties: spread\n", "scoring.ties: Input should be 'keep_whole' or 'row'"),
])
def test_invalid_file_names_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_admin_config(write(tmp_path, text))
    assert message in str(exc.value)


def test_tolerance_defaults_to_the_shipped_one_and_is_read(tmp_path: Path) -> None:
    assert load_admin_config(write(tmp_path, "scoring:\n  preset: default\n")).tolerance == DEFAULT_TOLERANCE
    exact = load_admin_config(write(tmp_path, "scoring:\n  tolerance: {workload: 0, cpu_pressure: 0, spare_need: 0, "
                                              "churn: 0}\n"))
    assert exact.tolerance == Tolerance(0.0, {"cpu_pressure": 0.0, "spare_need": 0.0, "churn": 0.0})


def test_the_config_bounds_every_strategy_term_and_nothing_else() -> None:
    # A strategy that declares a cluster-wide term (scoring.strategies: TERM) gets its bound
    # in scoring.tolerance, under the same name, defaulting to its TERM_TOLERANCE.
    terms = {s.term.name: s.term.tolerance for s in STRATEGIES.values() if s.term is not None}
    assert set(ToleranceFile.model_fields) == {"workload", *terms}
    assert ToleranceFile().tolerance() == DEFAULT_TOLERANCE
    assert dict(DEFAULT_TOLERANCE.terms) == terms


def test_every_preset_is_valid() -> None:
    for name in PRESETS:
        assert scoring_config(name) == PRESETS[name]


def test_serve_refuses_invalid_config_before_listening(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "scoring:\n  weights:\n    spread: -1\n")
    assert main(["serve", "--config", str(path), "--port", "0"]) == 2
    assert "scoring.weights.spread" in capsys.readouterr().err


def test_config_validate_for_admins_and_ci(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "scoring:\n  preset: default\n  weights:\n    node_packing: 2\n"
                           "  qos_overrides:\n    best-effort: {node_packing: 3}\n")
    assert main(["config", "validate", str(good)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "node_packing=2" in out and "best-effort: node_packing=3" in out
    assert (f"tolerance: workload={DEFAULT_TOLERANCE.workload:g}, churn={DEFAULT_TOLERANCE.of('churn'):g}"
            f", cpu_pressure={DEFAULT_TOLERANCE.of('cpu_pressure'):g}"
            f", spare_need={DEFAULT_TOLERANCE.of('spare_need'):g}") in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("scoring:\n  preset: default\n  weights:\n    spread: -1\n    nope: 1\n")
    assert main(["config", "validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "scoring.weights.spread: must be a finite number >= 0, got -1.0" in err
    assert "nope" in err


# -- the command line ----------------------------------------------------------------------

def test_version_and_help_name_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from extender.cli import build_parser, main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("gpufrac ")
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    # Every tuning flag says its default, taken from Settings (so help and behaviour agree).
    # argparse lists each flag twice (usage, then options): its help follows the second.
    serve_help = capsys.readouterr().out
    for flag, default in (("--port", "8888"), ("--host", "127.0.0.1"), ("--preset", "default"),
                          ("--inventory-stale-after-s", "180.0"), ("--assume-ttl-s", "60.0")):
        described = " ".join(serve_help.split(f"  {flag} ")[-1].split()[:40])
        assert f"(default {default})" in described, (flag, described)
    assert "composition root" not in build_parser().format_help()


def test_inspect_without_credentials_says_so_instead_of_a_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from extender.cli import main

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["inspect"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpufrac: no Kubernetes credentials: pass --kubeconfig, set $KUBECONFIG")
    assert "Traceback" not in err


def test_inspect_reads_kubeconfig_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # $KUBECONFIG is honoured when --kubeconfig is absent (it asked for in-cluster credentials).
    from podspec.kubeio import kube_api

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert kube_api(None).api_client.configuration.host == "https://127.0.0.1:6443"


def test_serve_logs_where_it_listens_and_which_config_it_loaded(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys
    import time

    config = tmp_path / "gpufrac.yaml"
    config.write_text("scoring: {preset: default}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "extender", "serve", "--mode", "standalone", "--port",
                             str(port), "--config", str(config)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30  # until it accepts connections, or gives up
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert f"verbs on http://127.0.0.1:{port}" in err, err
    assert f"gpufrac config: {config} (reloaded on change)" in err, err


def test_prior_and_ties_from_the_admin_config(tmp_path: Path) -> None:
    cfg = load_admin_config(write(tmp_path, (
        "scoring:\n  preset: default\n  ties: row\n  prior:\n    floor: 0.02\n    shapes:\n"
        "    - {gpus: 8, weight: 3}\n    - {fraction: 0.25}\n"))).scoring
    # Shapes in milli-GPU; pods kept from the preset's prior; ties replaced.
    assert cfg.prior == ShapePrior(((8, 1000, 3), (1, 250, 1)), PRESETS["default"].prior.pods, 0.02)
    assert cfg.ties == Ties.ROW
    # Left out: the preset's (the paper baselines have none).
    assert load_admin_config(write(tmp_path, "scoring:\n  preset: fgd\n")).scoring.prior == PRESETS["fgd"].prior



def test_cli_flags_the_docs_name_exist_and_a_bad_log_level_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # deploy/README.md and rbac.yaml tell users to pass --requeue-max-pods 0 (issue 39).
    from extender.cli import build_parser

    args = build_parser("gpufrac").parse_args(
        ["serve", "--requeue-max-pods", "0", "--scheduler-name", "my-scheduler", "--log-level", "info"])
    assert (args.requeue_max_pods, args.scheduler_name, args.log_level) == (0, "my-scheduler", "info")
    with pytest.raises(SystemExit) as exc:
        build_parser("gpufrac").parse_args(["serve", "--log-level", "verbose"])
    assert exc.value.code == 2
    assert "invalid choice: 'verbose'" in capsys.readouterr().err


TEN_MISTAKES = """\
scoring:
  preset: defualt                     # 1 unknown preset (checked beside the schema)
  weights: {fgd: -1, gap_prise: 2}    # 2 negative weight, 3 unknown strategy
  tolerance: {workload: 5}            # 4 above 1
  prior: {floor: 0.9}                 # 5 above 0.5
  tie: row                            # 6 unknown key
qos:
  best_effort_oversubscription: 9     # 7 above 4
  isolate_guarantee: true             # 8 unknown key
tenants:
  a: {namespaces: [x], qos_ceiling: gold}   # 9 not a QoS class
  b: {namespaces: [y, y]}                   # 10 one namespace twice
default_tenant: c                           # 11 no such tenant
"""


def test_config_validate_reports_every_mistake_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 39: a file with 11 mistakes took 3 runs; schema errors had no value, no
    # suggestion. Now one run names each, with its path, the value and a did-you-mean.
    path = write(tmp_path, TEN_MISTAKES)
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    expected = [
        "scoring.preset: unknown preset 'defualt'; did you mean 'default'?",
        "scoring.weights.fgd: must be a finite number >= 0, got -1",
        "scoring.weights.gap_prise: unknown strategy; did you mean 'gap_price'?",
        "scoring.tolerance.workload: Input should be less than or equal to 1 (got 5)",
        "scoring.prior.floor: Input should be less than or equal to 0.5 (got 0.9)",
        "scoring.tie: unknown key; did you mean 'ties'?",
        "qos.best_effort_oversubscription: Input should be less than or equal to 4 (got 9)",
        "qos.isolate_guarantee: unknown key; did you mean 'isolate_guaranteed'?",
        "tenants.a.qos_ceiling: Input should be 'guaranteed', 'burstable' or 'best-effort' (got 'gold')",
        "tenants.b.namespaces.1: namespace 'y' already belongs to tenant 'b'",
        "default_tenant: unknown tenant 'c'; known: a, b",
    ]
    for line in expected:
        assert line in err, line
    assert len([line for line in err.splitlines() if ": " in line and not line.startswith("gpufrac:")]) == len(expected)


def test_a_namespace_in_two_tenants_is_reported_beside_their_own_errors(tmp_path: Path) -> None:
    # Issue 53: the clash was found only between tenants that validated, so a file whose
    # tenants both had a mistaken key needed a second run to show it.
    path = write(tmp_path, "tenants:\n  a: {namespaces: [team-x], quota_gpu_milli: 5}\n"
                           "  b: {namespaces: [team-x], max_qos: gold}\n")
    with pytest.raises(ConfigError) as exc:
        load_admin_config(path)
    assert str(exc.value).splitlines() == [
        "tenants.a.quota_gpu_milli: unknown key; allowed here: namespaces, qos_ceiling, quota",
        "tenants.b.max_qos: unknown key; allowed here: namespaces, qos_ceiling, quota",
        "tenants.b.namespaces.0: namespace 'team-x' already belongs to tenant 'a'"]


def test_a_yaml_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "scoring: [\n")
    with pytest.raises(ConfigError) as exc:
        load_admin_config(path)
    assert f'in "{path}"' in str(exc.value) and "<unicode string>" not in str(exc.value)


def test_config_schema_command_rewrites_the_charts_config_value(tmp_path: Path) -> None:
    import json

    from extender.cli import main

    chart_schema = Path(__file__).resolve().parents[2] / "deploy/helm/gpufrac/values.schema.json"
    stale = json.loads(chart_schema.read_text())
    stale["properties"]["config"] = {"type": "object"}
    stale["$defs"] = {}
    target = tmp_path / "values.schema.json"
    target.write_text(json.dumps(stale))
    assert main(["config", "schema", "--values-schema", str(target)]) == 0
    assert json.loads(target.read_text()) == json.loads(chart_schema.read_text())


def test_standalone_without_a_cluster_file_says_it_knows_no_nodes(caplog: pytest.LogCaptureFixture,
                                                                   tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from extender.app import create_app
    from extender.settings import Settings

    with caplog.at_level("WARNING", logger="extender.app"), TestClient(create_app(Settings())):
        pass
    assert "standalone mode without --cluster-file: no nodes are known" in caplog.text
    caplog.clear()
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n- name: a\n  cpu_milli: 8000\n  memory_mib: 32768\n  gpus: []\n")
    with caplog.at_level("WARNING", logger="extender.app"), TestClient(create_app(Settings(cluster_file=nodes))):
        pass
    assert "no nodes are known" not in caplog.text


def test_config_validate_of_helm_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("agent: {enabled: true}\n")  # no config: the chart's default applies
    assert main(["config", "validate", "--helm-values", str(values)]) == 0
    assert "no `config:` value: the chart's default admin config applies" in capsys.readouterr().out
    for text, said in (("config: 3\n", "not a number"), ("config:\n", "not null"), ("config: [a]\n", "not a list")):
        values.write_text(text)
        assert main(["config", "validate", "--helm-values", str(values)]) == 2
        err = capsys.readouterr().err
        assert f"config: must be a mapping (the admin config, docs/admin.md), {said}" in err and "NoneType" not in err
    values.write_text("config:\n  scoring: {preset: bestfit}\n")
    assert main(["config", "validate", "--helm-values", str(values)]) == 0
