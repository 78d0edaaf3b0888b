"""gpufrac's placement core: cluster state as numpy arrays, feasibility, scores, GPU choice.

Pure numpy + stdlib: no HTTP, no Kubernetes, no NVML.
"""

from scoring.evaluated import Evaluation
from scoring.fit import FitContext, Reason
from scoring.presets import PRESETS
from scoring.registry import STRATEGIES
from scoring.request import MILLI_PER_GPU, PodRequest, QoSClass
from scoring.scorer import Scorer, ScoringConfig, build_scorer
from scoring.specs import Allocation, GpuSpec, NodeSpec
from scoring.state import ClusterState

__all__ = [
    "MILLI_PER_GPU", "PRESETS", "STRATEGIES", "Allocation", "ClusterState", "Evaluation",
    "FitContext", "GpuSpec", "NodeSpec", "PodRequest", "QoSClass", "Reason", "Scorer",
    "ScoringConfig", "build_scorer",
]
