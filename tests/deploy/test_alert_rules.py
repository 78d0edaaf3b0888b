"""The chart's alerting rules (deploy/helm/gpufrac/rules/gpufrac-rules.yaml) through Prometheus'
own ``promtool``: the file is valid, and each alert fires on the series the extender exports
when its condition holds, and not otherwise (``promtool test rules``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from harness.builds import ensure_debian
from harness.processes import ROOT

RULES = ROOT / "deploy" / "helm" / "gpufrac" / "rules" / "gpufrac-rules.yaml"

LEASE = 'gpufrac_scheduler_lease_renew_age_seconds{lease="gpufrac-system/gpufrac-scheduler",holder="%s",holder_in_release="%s"}'

CASES = {
    "rule_files": [str(RULES)],
    "evaluation_interval": "15s",
    "tests": [{
        "interval": "15s",
        "input_series": [
            # a stall that lasts (pods wait unattempted from minute 1), a stranger's Lease from the start
            {"series": "gpufrac_pods_not_attempted", "values": "0 0 0 0 3x20"},
            {"series": LEASE % ("stranger", "false"), "values": "0+15x24"},
            {"series": LEASE % ("gpufrac-scheduler-6f7c-x_1b2c", "true"), "values": "0+1x24"},
            {"series": 'gpufrac_watch_silence_seconds{watch="pod"}', "values": "0+15x24"},
            {"series": 'gpufrac_watch_silence_seconds{watch="node"}', "values": "1x24"},
            {"series": 'gpufrac_clock_skew_seconds{kind="node",name="n1"}', "values": "-600x40"},
            {"series": 'gpufrac_clock_skew_seconds{kind="node",name="n2"}', "values": "2x40"},
            {"series": "gpufrac_config_valid", "values": "1x40"},
            {"series": 'gpufrac_node_inventory_stale{node="n1"}', "values": "0 0 0 0 1x36"},
            {"series": 'gpufrac_node_inventory_stale{node="n2"}', "values": "0x40"},
            {"series": 'gpufrac_bind_total{result="error"}', "values": "0+0x8 0+3x32"},
            {"series": 'gpufrac_bind_total{result="conflict"}', "values": "0+1x100"},
            {"series": "gpufrac_pods_waiting_for_fragmentation", "values": "2x200"},
            # replica a compiles for a minute, then numba scores; replica b scores with numpy throughout
            {"series": 'gpufrac_scoring_info{backend="numpy, compiling",pod="a"}', "values": "1x4"},
            {"series": 'gpufrac_scoring_info{backend="numba 0.68.1",pod="a"}', "values": "_x4 1x100"},
            {"series": 'gpufrac_scoring_info{backend="numpy",pod="b"}', "values": "1x100"},
        ],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "GpufracGpuPodsNotAttempted", "exp_alerts": []},
            {"eval_time": "3m", "alertname": "GpufracGpuPodsNotAttempted", "exp_alerts": [{
                "exp_labels": {"severity": "critical"},
                "exp_annotations": {
                    "summary": "GPU pods of gpufrac's scheduler wait and no scheduler attempts them",
                    "description": "3 GPU pod(s) of gpufrac's scheduler profile have no scheduling attempt after "
                                   "--stall-after-s. The scheduler's Lease holder is in "
                                   "gpufrac_scheduler_lease_renew_age_seconds and in /readyz's scheduler detail; "
                                   "docs/troubleshooting.md, \"GPU pods pending, no scheduler attempt\"."}}]},
            {"eval_time": "3m", "alertname": "GpufracSchedulerLeaseHeldByStranger", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "lease": "gpufrac-system/gpufrac-scheduler",
                               "holder": "stranger"},
                "exp_annotations": {
                    "summary": "The scheduler's Lease gpufrac-system/gpufrac-scheduler is held by stranger, "
                               "not a gpufrac scheduler pod",
                    "description": "While someone else holds it, no gpufrac kube-scheduler leads and no GPU pod "
                                   "of the profile is scheduled; docs/troubleshooting.md, \"GPU pods pending, no "
                                   "scheduler attempt\"."}}]},
            {"eval_time": "1m45s", "alertname": "GpufracWatchSilent", "exp_alerts": []},
            {"eval_time": "5m", "alertname": "GpufracWatchSilent", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "watch": "pod"},
                "exp_annotations": {"summary": "gpufrac's pod watch has shown no sign of life for 300 s",
                                    "description": "The replica's view of the cluster is going stale; its "
                                                   "/readyz says 503 meanwhile."}}]},
            {"eval_time": "6m", "alertname": "GpufracClockSkew", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "kind": "node", "name": "n1"},
                "exp_annotations": {"summary": "The clock of node n1 is 600 s off this replica's",
                                    "description": "gpufrac judges freshness by its own clock only, but logs and "
                                                   "Events disagree; fix NTP."}}]},
            {"eval_time": "9m", "alertname": "GpufracConfigInvalid", "exp_alerts": []},
            {"eval_time": "2m30s", "alertname": "GpufracInventoryStale", "exp_alerts": []},
            {"eval_time": "3m15s", "alertname": "GpufracInventoryStale", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "node": "n1"},
                "exp_annotations": {
                    "summary": "Node n1 gets no GPU pods: its gpufrac.io/inventory is stale or missing",
                    "description": "The node's agent has not changed its heartbeat within --inventory-stale-after-s, "
                                   "or never wrote a valid inventory; docs/troubleshooting.md, \"Stale inventory\"."}}]},
            {"eval_time": "4m", "alertname": "GpufracBindsFailing", "exp_alerts": []},
            {"eval_time": "9m", "alertname": "GpufracBindsFailing", "exp_alerts": [{
                "exp_labels": {"severity": "warning"},
                "exp_annotations": {"summary": "gpufrac's binds are failing",
                                    "description": "Binds answered with an error for 5 minutes (0.2 a second): the "
                                                   "API server or the claim ledgers cannot be written; the extender's "
                                                   "log names the error."}}]},
            {"eval_time": "9m", "alertname": "GpufracFenceConflicts", "exp_alerts": []},
            {"eval_time": "19m", "alertname": "GpufracFenceConflicts", "exp_alerts": [{
                "exp_labels": {"severity": "warning"},
                "exp_annotations": {"summary": "gpufrac replicas keep losing binds to each other",
                                    "description": "A steady rate of fenced conflicts (0.06666666666666667 a second) "
                                                   "means the replicas' caches lag the API: check the API server's "
                                                   "latency; docs/troubleshooting.md, \"A pod stays Pending\"."}}]},
            {"eval_time": "29m", "alertname": "GpufracPodsWaitingForFragmentation", "exp_alerts": []},
            {"eval_time": "31m", "alertname": "GpufracPodsWaitingForFragmentation", "exp_alerts": [{
                "exp_labels": {"severity": "info"},
                "exp_annotations": {"summary": "2 GPU pod(s) wait for room that is free only in pieces",
                                    "description": "Their request is free in sum but on no single node; `gpufrac "
                                                   "inspect --defrag` shows which moves would make room (docs/admin.md, "
                                                   "\"Defragmentation plan\")."}}]},
            {"eval_time": "14m", "alertname": "GpufracScoringWithoutKernels", "exp_alerts": []},
            {"eval_time": "16m", "alertname": "GpufracScoringWithoutKernels", "exp_alerts": [{
                "exp_labels": {"severity": "info"},
                "exp_annotations": {"summary": "1 gpufrac replica(s) score with numpy, not the compiled kernels",
                                    "description": "The same placements, each decision slower; the compile takes "
                                                   "seconds at start, so 15 minutes means numba did not load or "
                                                   "compile there: the extender's log says why "
                                                   "(docs/troubleshooting.md, \"Scoring with numpy\")."}}]},
        ],
    }],
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ensure_debian("promtool", "prometheus")), *args], capture_output=True, text=True,
                          timeout=120)


def test_the_rules_file_is_valid_prometheus() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0 and "SUCCESS: 10 rules found" in proc.stdout, proc.stdout + proc.stderr


def test_each_alert_fires_when_its_condition_holds_and_not_before(tmp_path: Path) -> None:
    cases = tmp_path / "gpufrac-rules-test.yaml"
    cases.write_text(yaml.safe_dump(CASES, sort_keys=False))
    proc = promtool("test", "rules", str(cases))
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    # The check above can fail: the same series, the stall alert expected at one minute.
    broken = yaml.safe_load(yaml.safe_dump(CASES))
    broken["tests"][0]["alert_rule_test"][0]["exp_alerts"] = [{"exp_labels": {"severity": "critical"}}]
    cases = tmp_path / "broken.yaml"
    cases.write_text(yaml.safe_dump(broken, sort_keys=False))
    assert promtool("test", "rules", str(cases)).returncode != 0
