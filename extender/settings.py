"""Process settings (environment ``GPUFRAC_*`` or CLI flags) and the admin config file.

Settings are built once in the composition root (``extender.cli``) and injected into
``create_app``; nothing here is read at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from extender.tenants import NO_TENANTS, Tenant, TenantPolicy
from scoring.incremental import DEFAULT_TOLERANCE, Tolerance
from scoring.presets import PRESETS
from scoring.request import MILLI_PER_GPU, QoSClass, QosPolicy
from scoring.scorer import ScoringConfig, Ties, build_scorer, validate_config
from scoring.workload import MAX_PRIOR_GPUS, MAX_PRIOR_WEIGHT, ShapePrior


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
    """Admin config (scoring weights, QoS rules, tenants); the shipped default when absent.
    Re-read every ``config_poll_s``: a valid change applies without a restart."""
    config_poll_s: float = Field(2.0, gt=0)
    preset: str = "default"
    """Weight preset used when no config file is given (``scoring.presets.PRESETS``)."""
    decision: Literal["filter", "prioritize"] = "filter"
    """Where gpufrac's node choice reaches kube-scheduler. ``filter``: ``filter`` returns only
    the chosen node, so kube-scheduler skips ``prioritize`` and its own score plugins (one
    call a pod fewer, no scoring phase); soft constraints (preferred affinities, topology
    spread ``ScheduleAnyway``) then no longer rank GPU pods' nodes. ``prioritize``: every
    feasible node passes ``filter`` and ``prioritize`` gives the chosen one 10 (with the
    extender weight of ``scheduler-config.yaml`` kube-scheduler's scores cannot overturn it,
    but break gpufrac's ties among nodes it gave equal rank). Same placements either way."""
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
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
    fence_namespace: str | None = Field(None, min_length=1, max_length=63)
    """Cluster mode: namespace of the per-node claim ledgers (``extender.fence``); set, every
    bind first writes its claim there by compare-and-swap, so several replicas never commit
    colliding allocations (deploy sets it to gpufrac's own namespace). Unset: no fence, for
    one replica only."""
    bind_api_timeout_s: float = Field(4.0, gt=0, le=300)
    """Cluster mode: limit of each API call a bind makes (reading the pod or the claim
    ledger, writing the claim, the Binding), seconds. Below kube-scheduler's ``httpTimeout``
    (5 s as shipped), after which it abandons the bind anyway: a bind the API server cannot
    answer (etcd down) is refused with a message instead of holding a worker thread."""
    claim_ttl_s: float = Field(60.0, gt=0)
    """Cluster mode, fenced: how long a claim counts, seconds (longer than a bind plus the
    pod watch's lag)."""
    instance_id: str | None = Field(None, min_length=1, max_length=253)
    """Cluster mode, fenced: this replica's identity in its claims; ``<hostname>-<random>``
    when unset."""
    tls_cert_file: Path | None = None
    """Serve HTTPS with this certificate (PEM); kube-scheduler's ``enableHTTPS`` and
    ``tlsConfig.caFile``/``insecure`` must match."""
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    """Require a client certificate signed by this CA (PEM): only kube-scheduler, holding one
    (``tlsConfig.certFile``/``keyFile``), may call the extender."""
    max_request_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """Larger request bodies get 413 (a 5,000-node ``ExtenderArgs`` with full Node objects is
    about 30 MB; with ``nodeCacheCapable`` names only, 85 KB)."""
    timeout_keep_alive_s: int = Field(30, ge=1)
    """Idle keep-alive connections are closed after this long (kube-scheduler reconnects)."""
    health_port: int | None = Field(None, ge=0, le=65535)
    """A second, plain-HTTP listener on ``health_host:health_port`` serving only ``/healthz``,
    ``/readyz`` and ``/metrics`` (kubelet probes and Prometheus; they cannot present the
    client certificate the verb port requires). None: no second listener."""
    health_host: str = "0.0.0.0"
    """Address of the health listener: all interfaces, since probes and scrapes come from
    outside the pod."""
    request_read_timeout_s: float = Field(10.0, gt=0)
    """A client that has not sent a whole request (headers and body) this long after
    connecting, or after the first byte of a later request, is disconnected (slow or
    half-sent requests never hold a connection or a worker; ``extender.server``)."""
    events_token: SecretStr | None = None
    """Standalone mode: bearer token the ``/standalone/pod-events`` endpoint requires
    (``Authorization: Bearer <token>``). Unset: the endpoint is off (404). Set it through
    ``$GPUFRAC_EVENTS_TOKEN`` (or ``--events-token-file``) rather than on the command line."""

    @model_validator(mode="after")
    def _tls_pairs(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file: give both or neither")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file: client certificates need tls_cert_file and tls_key_file")
        return self


class ToleranceFile(BaseModel):
    """``scoring.tolerance:``: how far the cluster-wide terms may drift before every node is
    scored anew (``scoring.incremental.Tolerance``; all 0: exact, a full pass per change)."""

    model_config = ConfigDict(extra="forbid")

    workload: float = Field(DEFAULT_TOLERANCE.workload, ge=0.0, le=1.0)
    cpu_pressure: float = Field(DEFAULT_TOLERANCE.cpu_pressure, ge=0.0, allow_inf_nan=False)
    spare_need: float = Field(DEFAULT_TOLERANCE.spare_need, ge=0.0, le=1.0)


class PriorShapeFile(BaseModel):
    """One entry of ``scoring.prior.shapes``: a pod shape the cluster expects."""

    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(1, ge=1, le=MAX_PRIOR_GPUS)
    """GPUs per pod."""
    fraction: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    """Share of each GPU (below 1 only for one-GPU pods)."""
    weight: int = Field(1, ge=1, le=MAX_PRIOR_WEIGHT)
    """Relative weight among the shapes: pseudo-pods are dealt in proportion."""

    @model_validator(mode="after")
    def _whole_gpus_for_multi_gpu(self) -> PriorShapeFile:
        if self.gpus > 1 and self.fraction != 1.0:
            raise ValueError(f"a pod of {self.gpus} GPUs takes whole GPUs: fraction must be 1, "
                             f"got {self.fraction:g}")
        if round(self.fraction * MILLI_PER_GPU) < 1:
            raise ValueError(f"fraction: at least 0.001 of a GPU, got {self.fraction:g}")
        return self


class PriorFile(BaseModel):
    """``scoring.prior:``: the shapes the learned workload starts from
    (``scoring.workload.ShapePrior``); a field left out keeps the preset's."""

    model_config = ConfigDict(extra="forbid")

    pods: int | None = Field(None, ge=0, le=1_000_000)
    """Pseudo-pods the prior is worth while few pods are observed (0 with floor 0: no prior)."""
    floor: float | None = Field(None, ge=0.0, le=0.5, allow_inf_nan=False)
    """Share of the counted pods the shapes not seen yet hold together."""
    shapes: list[PriorShapeFile] | None = Field(None, max_length=64)
    """Expected shapes; left out or empty: whole and half nodes of every node size, a whole
    GPU, half and a quarter of one."""


class ScoringFile(BaseModel):
    """``scoring:`` section of the admin config file."""

    model_config = ConfigDict(extra="forbid")

    preset: str = "default"
    weights: dict[str, float] = Field(default_factory=dict)
    qos_overrides: dict[str, dict[str, float]] = Field(default_factory=dict)
    tolerance: ToleranceFile = Field(default_factory=ToleranceFile)
    prior: PriorFile = Field(default_factory=PriorFile)
    ties: Literal["keep_whole", "row"] | None = None
    """How nodes of equal score are ordered (``scoring.scorer.Ties``); left out: the preset's."""


class QosFile(BaseModel):
    """``qos:`` section: what each QoS class may share (``scoring.request.QosPolicy``)."""

    model_config = ConfigDict(extra="forbid")

    isolate_guaranteed: bool = False
    """Guaranteed and best-effort pods never share a GPU."""
    best_effort_oversubscription: float = Field(1.0, ge=1.0, le=4.0)
    """Best-effort pods may fill a GPU's share up to this factor (1.0: not oversubscribed)."""


class QuotaFile(BaseModel):
    """A tenant's GPU quota; an absent field is not limited."""

    model_config = ConfigDict(extra="forbid")

    gpu_milli: int | None = Field(None, ge=0)
    """Sum of GPU shares of the tenant's bound pods, milli-GPU (4000 = four GPUs)."""
    gpu_memory_mib: int | None = Field(None, ge=0)
    """Sum of the GPU memory they hold, MiB."""


class TenantFile(BaseModel):
    """One entry of ``tenants:``."""

    model_config = ConfigDict(extra="forbid")

    namespaces: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(default_factory=list)
    qos_ceiling: Literal["guaranteed", "burstable", "best-effort"] = "guaranteed"
    quota: QuotaFile = Field(default_factory=QuotaFile)


class AdminConfig(BaseModel):
    """The admin config file (YAML)."""

    model_config = ConfigDict(extra="forbid")

    scoring: ScoringFile = Field(default_factory=ScoringFile)
    qos: QosFile = Field(default_factory=QosFile)
    tenants: dict[str, TenantFile] = Field(default_factory=dict)
    default_tenant: str | None = None
    """Tenant of the namespaces no tenant lists; absent: those namespaces are not restricted."""
    tenant_label: Annotated[str, Field(min_length=1, max_length=317)] | None = None
    """A namespace label whose value is a tenant name (for namespaces not listed by name)."""


@dataclass(frozen=True)
class AdminPolicy:
    """Everything the admin config decides, validated: scoring (weights, QoS rules) and tenants."""

    scoring: ScoringConfig
    tenants: TenantPolicy = NO_TENANTS
    tolerance: Tolerance = DEFAULT_TOLERANCE


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
        prior=overrides.get("prior", base.prior),
        ties=Ties(overrides.get("ties", base.ties)),
    )
    errors = validate_config(cfg)
    if errors:
        raise ConfigError("\n".join(errors))
    return cfg


def _tenant_policy(parsed: AdminConfig) -> TenantPolicy:
    errors: list[str] = []
    qos = {q.wire_name: q for q in QoSClass}
    tenants = {
        name: Tenant(name, qos[t.qos_ceiling], t.quota.gpu_milli, t.quota.gpu_memory_mib)
        for name, t in parsed.tenants.items()
    }
    by_ns: dict[str, Tenant] = {}
    for name, t in parsed.tenants.items():
        for i, ns in enumerate(t.namespaces):
            if ns in by_ns:
                errors.append(f"tenants.{name}.namespaces.{i}: namespace {ns!r} already belongs "
                              f"to tenant {by_ns[ns].name!r}")
            by_ns[ns] = tenants[name]
    default = None
    if parsed.default_tenant is not None:
        default = tenants.get(parsed.default_tenant)
        if default is None:
            errors.append(f"default_tenant: unknown tenant {parsed.default_tenant!r}; known: "
                          f"{', '.join(sorted(tenants)) or '(none)'}")
    if errors:
        raise ConfigError("\n".join(errors))
    return TenantPolicy(by_ns, default, parsed.tenant_label, tenants)


def _prior(base: ShapePrior, given: PriorFile) -> ShapePrior:
    """The preset's prior with the fields the config gives replaced."""
    shapes = base.shapes if given.shapes is None else tuple(
        (s.gpus, round(s.fraction * MILLI_PER_GPU), s.weight) for s in given.shapes)
    return ShapePrior(shapes, base.pods if given.pods is None else given.pods,
                      base.floor if given.floor is None else given.floor)


def parse_admin_config(text: str, source: str = "config") -> AdminPolicy:
    """Validate the text of an admin config file.

    Parameters
    ----------
    text : str
        YAML.
    source : str
        Name for YAML syntax errors (the file path).

    Returns
    -------
    AdminPolicy

    Raises
    ------
    ConfigError
        On invalid YAML or any invalid field, one ``field.path: message`` per line.
    """
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        parsed = AdminConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )) from None
    sc = parsed.scoring
    overrides: dict[str, Any] = {"weights": sc.weights, "qos_overrides": sc.qos_overrides}
    if sc.preset in PRESETS:
        overrides["prior"] = _prior(PRESETS[sc.preset].prior, sc.prior)
    if sc.ties is not None:
        overrides["ties"] = sc.ties
    scoring = scoring_config(sc.preset, overrides)
    policy = QosPolicy(parsed.qos.isolate_guaranteed,
                       round(parsed.qos.best_effort_oversubscription * MILLI_PER_GPU))
    return AdminPolicy(replace(scoring, qos=policy), _tenant_policy(parsed),
                       Tolerance(sc.tolerance.workload, sc.tolerance.cpu_pressure, sc.tolerance.spare_need))


def load_policy(path: Path) -> AdminPolicy:
    """Read and validate the admin config file (``parse_admin_config``).

    Raises
    ------
    ConfigError
        On an unreadable file, invalid YAML or any invalid field, with field paths.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return parse_admin_config(text, str(path))


def load_admin_config(path: Path) -> ScoringConfig:
    """The scoring part of the admin config file (``load_policy``); raises ``ConfigError``."""
    return load_policy(path).scoring


def policy_from_settings(settings: Settings) -> AdminPolicy:
    """The policy a process starts with: the config file, else the preset and no tenants."""
    if settings.config_file is not None:
        return load_policy(settings.config_file)
    return AdminPolicy(scoring_config(settings.preset))


__all__ = ["Settings", "ConfigError", "AdminPolicy", "load_admin_config", "load_policy",
           "parse_admin_config", "policy_from_settings", "scoring_config", "build_scorer"]
