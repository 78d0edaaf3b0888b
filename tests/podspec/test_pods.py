"""Pod annotations and resources -> PodIntent: defaults, and a precise error for bad input."""

from __future__ import annotations

import pytest

from podspec.pods import pod_intent
from podspec.quantities import PodSpecError
from scoring.request import QoSClass
from tests.conftest import pod_json


def test_defaults() -> None:
    it = pod_intent(pod_json(gpus=2, cpu="1500m", memory="2Gi"))
    assert (it.gpu_count, it.gpu_milli, it.gpu_memory_mib, it.gpu_models) == (2, 1000, None, None)
    assert it.qos == QoSClass.BURSTABLE
    assert (it.cpu_milli, it.memory_mib) == (1500, 2048)


def test_all_annotations() -> None:
    it = pod_intent(pod_json(annotations={
        "gpufrac.io/fraction": "0.25", "gpufrac.io/memory": "500Mi",
        "gpufrac.io/gpu-model": "T4|V100M32", "gpufrac.io/qos": "best-effort"}))
    assert it.gpu_milli == 250
    assert it.gpu_memory_mib == 500
    assert it.gpu_models == frozenset({"T4", "V100M32"})
    assert it.qos == QoSClass.BEST_EFFORT


def test_memory_rounds_up_to_whole_mib() -> None:
    # 1G = 10^9 bytes = 953.67 MiB -> 954
    assert pod_intent(pod_json(annotations={"gpufrac.io/memory": "1G"})).gpu_memory_mib == 954


def test_effective_requests_with_init_containers() -> None:
    pod = pod_json(gpus=1, cpu="1", memory="1Gi")
    pod["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "500m"}}})
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "4", "memory": "512Mi"}}}]
    it = pod_intent(pod)
    # cpu = max(1000 + 500, 4000) = 4000 ; memory = max(1024, 512) = 1024
    assert (it.cpu_milli, it.memory_mib, it.gpu_count) == (4000, 1024, 1)


@pytest.mark.parametrize(("annotations", "gpus", "message"), [
    ({"gpufrac.io/fraction": "abc"}, 1,
     'gpufrac.io/fraction: "abc" is not a plain decimal number; must be a decimal in [0.001, 1]'),
    ({"gpufrac.io/fraction": "0"}, 1, 'gpufrac.io/fraction: "0" is out of range; must be a decimal in [0.001, 1]'),
    ({"gpufrac.io/fraction": "1.5"}, 1, 'gpufrac.io/fraction: "1.5" is out of range'),
    ({"gpufrac.io/fraction": "-0.5"}, 1, 'gpufrac.io/fraction: "-0.5" is not a plain decimal number'),
    ({"gpufrac.io/fraction": "nan"}, 1, 'gpufrac.io/fraction: "nan" is not a plain decimal number'),
    # issue 22: rounded to 0 milli and passed, then the core raised (500 on every verb)
    ({"gpufrac.io/fraction": "1e-1000030"}, 1, 'gpufrac.io/fraction: "1e-1000030" is not a plain decimal'),
    # issue 22: Decimal reads non-ASCII digits ("\u0660.\u0665" was 0.5)
    ({"gpufrac.io/fraction": "\u0660.\u0665"}, 1, 'is not a plain decimal number'),
    ({"gpufrac.io/fraction": "0.0001"}, 1, 'gpufrac.io/fraction: "0.0001" is finer than 1/1000 GPU'),
    ({"gpufrac.io/fraction": "0.3333"}, 1, 'gpufrac.io/fraction: "0.3333" is finer than 1/1000 GPU'),
    ({"gpufrac.io/fraction": "0.5"}, 2,
     'gpufrac.io/fraction: "0.5" is below 1 but the pod asks for 2 GPUs (gpufrac.io/gpu); '
     "a share below 1 needs exactly 1 GPU"),
    ({"gpufrac.io/memory": "-1Gi"}, 1, 'gpufrac.io/memory: "-1Gi" must be > 0'),
    ({"gpufrac.io/memory": "0"}, 1, 'gpufrac.io/memory: "0" must be > 0'),
    ({"gpufrac.io/memory": "1e-999999"}, 1, 'gpufrac.io/memory: "1e-999999" is not a Kubernetes quantity'),
    ({"gpufrac.io/memory": "lots"}, 1, 'gpufrac.io/memory: "lots" is not a Kubernetes quantity'),
    # found by the HTTP fuzzing: 1e400 bytes overflowed the int64 arrays (a 500, not a 4xx)
    ({"gpufrac.io/memory": "1e400"}, 1, 'gpufrac.io/memory: "1e400" is too large (at most 17592186044416 bytes)'),
    ({"gpufrac.io/qos": "platinum"}, 1,
     'gpufrac.io/qos: "platinum" is not a QoS class; use one of guaranteed, burstable, best-effort'),
    ({"gpufrac.io/gpu-model": "T4||A10"}, 1, 'gpufrac.io/gpu-model: "T4||A10" must be 1 to 64 model names'),
    # issue 22: a list where a string belongs raised TypeError (HTTP 500)
    ({"gpufrac.io/qos": ["guaranteed"]}, 1, 'gpufrac.io/qos: "[\'guaranteed\']" is not a QoS class'),
    ({"gpufrac.io/fraction": 0.5}, 1, 'gpufrac.io/fraction: "0.5" must be a string'),
    ({"gpufrac.io/gpu-model": {"T4": 1}}, 1, 'gpufrac.io/gpu-model: "{\'T4\': 1}" must be a string'),
])
def test_bad_annotation_names_annotation_value_and_rule(annotations: dict[str, str], gpus: int,
                                                        message: str) -> None:
    with pytest.raises(PodSpecError) as exc:
        pod_intent(pod_json(gpus=gpus, annotations=annotations))
    assert message in str(exc.value)


def test_fractional_gpu_resource_is_refused() -> None:
    with pytest.raises(PodSpecError, match=r"must be a whole number of GPUs >= 0 \(use the gpufrac.io/fraction"):
        pod_intent(pod_json(gpus=None) | {"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"gpufrac.io/gpu": "500m"}}}]}})


def test_long_values_are_truncated_in_messages() -> None:
    with pytest.raises(PodSpecError) as exc:
        pod_intent(pod_json(annotations={"gpufrac.io/qos": "x" * 500}))
    assert len(str(exc.value)) < 200


@pytest.mark.parametrize("pod", [
    {"metadata": "nope"},
    {"metadata": {"name": "p", "annotations": ["a"]}},
    {"metadata": {"name": "p"}, "spec": {"containers": "x"}},
    {"metadata": {}},
    "not an object",
])
def test_malformed_pods_raise_pod_spec_error(pod: object) -> None:
    with pytest.raises(PodSpecError):
        pod_intent(pod)  # type: ignore[arg-type]  # not a Mapping, on purpose


def test_assigned_gpus_and_node() -> None:
    pod = pod_json(node="n1", phase="Running", annotations={"gpufrac.io/assigned-gpus": "GPU-a,GPU-b"})
    it = pod_intent(pod)
    assert it.node_name == "n1" and it.assigned_gpus == ("GPU-a", "GPU-b") and not it.finished


@pytest.mark.parametrize("annotation", ["gpufrac.io/fraction", "gpufrac.io/gpu-model", "gpufrac.io/qos",
                                        "gpufrac.io/memory"])
def test_annotation_content_never_reaches_messages_or_logs_unescaped(annotation: str) -> None:
    # a value forging a log line and an ANSI escape: messages (and the logs that carry them)
    # get it JSON-quoted and truncated
    evil = "|\n2026-11-22 ERROR forged line \x1b[31m" + "x" * 200
    pod = pod_json("p", annotations={annotation: evil})
    with pytest.raises(PodSpecError) as exc:
        pod_intent(pod)
    text = str(exc.value)
    assert "\n" not in text and "\x1b" not in text and "x" * 100 not in text
    assert "\\n2026-11-22 ERROR forged line" in text
