"""Process settings: environment ``GPUFRAC_*`` or CLI flags.

Settings are built once in the composition root (``extender.cli``) and injected into
``create_app``; nothing here is read at import time. The admin config file they may name is
``extender.admin_config``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from extender.admin_config import AdminConfig, load_admin_config, scoring_config


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
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Start-up, watch restarts, evictions and refused neighbours are logged at info (never
    one line per request); warnings are what needs a look."""
    kubeconfig: Path | None = None
    """Cluster mode: kubeconfig file; the in-cluster service account when absent."""
    inventory_stale_after_s: float = Field(180.0, gt=0)
    """Cluster mode: a node whose ``gpufrac.io/inventory`` heartbeat is older is infeasible."""
    assume_ttl_s: float = Field(60.0, gt=0)
    """Cluster mode: how long a bind's allocation is held before the pod watch confirms it."""
    watch_timeout_s: int = Field(30, ge=1, le=3600)
    """Cluster mode: server-side timeout of one watch request (it is then resumed); the client
    reads with a deadline 15 s later, so a watch whose connection went silent is resumed on a
    new one within ``watch_timeout_s + 15`` s, and ``/readyz`` names it silent past that."""
    scheduler_name: str = "gpufrac-scheduler"
    """Cluster mode: the kube-scheduler profile calling this extender (its pods are requeued)."""
    stall_after_s: float = Field(30.0, gt=0, le=86400)
    """Cluster mode: a pending GPU pod of ``scheduler_name`` that no scheduler has attempted
    (no ``PodScheduled`` condition) this long after gpufrac first saw it is reported: in
    ``/readyz``'s ``scheduler`` detail, ``gpufrac_pods_not_attempted``, the log and a Warning
    Event on the pod (``extender.cluster.stall``)."""
    scheduler_lease: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$")
    """Cluster mode: ``namespace/name`` of the Lease the profile's kube-scheduler elects its
    leader with; its holder is the cause a stall report names. Unset: not read."""
    gpu_models_configmap: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$")
    """Cluster mode: ``namespace/name`` of the ConfigMap the ``gpufrac-gpu-models`` admission
    policy reads; the GPU models of the nodes are written there (``extender.cluster.models``).
    Unset: not written."""
    scheduler_pod_selector: str | None = Field(None, min_length=1, max_length=1024)
    """Cluster mode: label selector of the release's kube-scheduler pods (in the Lease's
    namespace), to say whether the Lease's holder is one of them."""
    requeue_max_pods: int = Field(100, ge=0)
    """Cluster mode: pending GPU pods requeued when GPU share is freed (0: off)."""
    fence_namespace: str | None = Field(None, min_length=1, max_length=63)
    """Cluster mode: namespace of the per-node claim ledgers (``extender.fence``); set, every
    bind first writes its claim there by compare-and-swap, so several replicas never commit
    colliding allocations (deploy sets it to gpufrac's own namespace). Unset: no fence, for
    one replica only."""
    resource_claims: bool = False
    """Cluster mode: also watch ResourceClaims (``resource.k8s.io/v1``, Kubernetes 1.34+) and
    count the shares they hold of gpufrac's DRA driver ``gpu.gpufrac.io`` in the same book as
    annotation pods (``extender.cluster.resource_claims``); readiness then waits for the
    first claim list. The chart sets it with ``agent.draDriver``."""
    allocate_claims: bool = False
    """Cluster mode: gpufrac allocates the ResourceClaims of the pods it binds (for a profile
    without kube-scheduler's DynamicResources plugin; ``extender.cluster.claim_allocator``):
    the share is placed by gpufrac's core to the GPU and written to the claim before the
    Binding. Implies ``resource_claims``."""
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
        if self.allocate_claims:
            self.resource_claims = True
        return self


def admin_config_from_settings(settings: Settings) -> AdminConfig:
    """The policy a process starts with: the config file, else the preset and no tenants."""
    if settings.config_file is not None:
        return load_admin_config(settings.config_file)
    return AdminConfig(scoring_config(settings.preset))
