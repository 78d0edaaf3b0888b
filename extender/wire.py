"""Pydantic mirrors of kube-scheduler's ``k8s.io/kube-scheduler/extender/v1`` types.

The Go types have no json tags, so the keys are the Go field names (``Pod``, ``NodeNames``,
``FailedNodes``...). Go decodes replies case-insensitively; we always answer in the Go
spelling. Embedded Pods and Nodes stay plain JSON objects: ``extender.translate`` reads them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class NodeList(_Wire):
    """``v1.NodeList`` as sent when ``nodeCacheCapable`` is false."""

    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(_Wire):
    """Body of ``filter`` and ``prioritize``."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(_Wire):
    """Reply to ``filter``: passing nodes, failed nodes with reasons, or an error."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    """One entry of the ``prioritize`` reply (``HostPriorityList``)."""

    Host: str
    Score: int = Field(ge=0, le=10)


class ExtenderBindingArgs(_Wire):
    """Body of ``bind``."""

    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = Field(min_length=1)
    Node: str = Field(min_length=1)


class ExtenderBindingResult(_Wire):
    """Reply to ``bind``: empty ``Error`` on success."""

    Error: str = ""


class MetaPod(_Wire):
    """``extender/v1.MetaPod``: a pod by UID (nodeCacheCapable preemption)."""

    UID: str = Field(min_length=1)


class MetaVictims(_Wire):
    """``extender/v1.MetaVictims``: victims on one node, by UID."""

    Pods: list[MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = Field(0, ge=0, le=2**63 - 1)
    """Go ``int64``: larger values cannot be answered back (and cannot be real)."""


class Victims(_Wire):
    """``extender/v1.Victims``: victims on one node as full Pod objects (nodeCacheCapable false)."""

    Pods: list[dict[str, Any]] = Field(default_factory=list)
    NumPDBViolations: int = Field(0, ge=0, le=2**63 - 1)


class ExtenderPreemptionArgs(_Wire):
    """Body of ``preempt``: the preemptor and, per candidate node, kube-scheduler's victims."""

    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Victims] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None


class ExtenderPreemptionResult(_Wire):
    """Reply to ``preempt``: the nodes where preemption works, with gpufrac's victims."""

    NodeNameToMetaVictims: dict[str, MetaVictims] = Field(default_factory=dict)


class PodEvent(_Wire):
    """A pod watch event (``{"type", "object"}``), the standalone cache-update input."""

    type: str = Field(pattern="^(ADDED|MODIFIED|DELETED)$")
    object: dict[str, Any]
