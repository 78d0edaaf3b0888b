"""Process settings (environment ``GPUFRAC_*`` or CLI flags) and the admin config file.

Settings are built once in the composition root (``extender.cli``) and injected into
``create_app``; nothing here is read at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from scoring.presets import PRESETS
from scoring.strategies import ScoringConfig, build_scorer, validate_config


class Settings(BaseSettings):
    """How one extender process runs."""

    model_config = SettingsConfigDict(env_prefix="GPUFRAC_", extra="forbid")

    mode: Literal["standalone", "cluster"] = "standalone"
    """``standalone``: nodes from ``cluster_file``, pods from pod-event posts. ``cluster``:
    Nodes and Pods watched through the Kubernetes API, bind writes annotations and the
    Binding."""
    host: str = "127.0.0.1"
    port: int = Field(8888, ge=0, le=65535)
    cluster_file: Path | None = None
    """Standalone mode: the node list (YAML or CSV, see ``extender.clusterfile``)."""
    replicas_per_gpu: int = Field(20, ge=1, le=1000)
    """Replica slots per GPU for cluster files that do not say (openb CSV)."""
    config_file: Path | None = None
    """Admin config (scoring weights); the shipped default when absent."""
    preset: str = "default"
    """Weight preset used when no config file is given (``scoring.presets.PRESETS``)."""
    log_level: str = "warning"
    kubeconfig: Path | None = None
    """Cluster mode: kubeconfig file; the in-cluster service account when absent."""
    inventory_stale_after_s: float = Field(180.0, gt=0)
    """Cluster mode: a node whose ``gpufrac.io/inventory`` heartbeat is older is infeasible."""
    assume_ttl_s: float = Field(60.0, gt=0)
    """Cluster mode: how long a bind's allocation is held before the pod watch confirms it."""
    watch_timeout_s: int = Field(300, ge=1)
    """Cluster mode: server-side timeout of one watch request (it is then resumed)."""
    scheduler_name: str = "gpufrac-scheduler"
    """Cluster mode: the kube-scheduler profile calling this extender (its pods are requeued)."""
    requeue_max_pods: int = Field(100, ge=0)
    """Cluster mode: pending GPU pods requeued when GPU share is freed (0: off)."""


class ScoringFile(BaseModel):
    """``scoring:`` section of the admin config file."""

    model_config = ConfigDict(extra="forbid")

    preset: str = "default"
    weights: dict[str, float] = Field(default_factory=dict)
    qos_overrides: dict[str, dict[str, float]] = Field(default_factory=dict)


class AdminConfig(BaseModel):
    """The admin config file (YAML)."""

    model_config = ConfigDict(extra="forbid")

    scoring: ScoringFile = Field(default_factory=ScoringFile)


class ConfigError(ValueError):
    """Invalid admin config; one ``field.path: message`` per line."""


def scoring_config(preset: str, overrides: dict[str, Any] | None = None) -> ScoringConfig:
    """A preset, with per-strategy weights and QoS overrides replaced from ``overrides``.

    Raises
    ------
    ConfigError
        Unknown preset, or weights that fail ``scoring.strategies.validate_config``.
    """
    if preset not in PRESETS:
        raise ConfigError(f"scoring.preset: unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    base = PRESETS[preset]
    overrides = overrides or {}
    cfg = ScoringConfig(
        weights={**base.weights, **overrides.get("weights", {})},
        qos_overrides={**base.qos_overrides, **overrides.get("qos_overrides", {})},
    )
    errors = validate_config(cfg)
    if errors:
        raise ConfigError("\n".join(errors))
    return cfg


def load_admin_config(path: Path) -> ScoringConfig:
    """Read and validate the admin config file.

    Raises
    ------
    ConfigError
        On unreadable YAML or any invalid field, with field paths.
    """
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        parsed = AdminConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )) from None
    sc = parsed.scoring
    return scoring_config(sc.preset, {"weights": sc.weights, "qos_overrides": sc.qos_overrides})


def scoring_from_settings(settings: Settings) -> ScoringConfig:
    """The scoring config a process starts with: the config file, else the preset."""
    if settings.config_file is not None:
        return load_admin_config(settings.config_file)
    return scoring_config(settings.preset)


__all__ = ["Settings", "ConfigError", "load_admin_config", "scoring_config",
           "scoring_from_settings", "build_scorer"]
