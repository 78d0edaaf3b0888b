"""The admin config file: its schema, its validation, and what it decides.

``parse_admin_config`` reads the YAML into ``AdminConfigFile`` (every field checked, errors with
field paths and a did-you-mean), then into an ``AdminConfig``: the ``ScoringConfig`` (a preset
with weights, QoS overrides, the shape prior, learning and ties replaced), the tenants
(``extender.tenants``), the incremental scorer's tolerance. Reloaded live (``extender.reload``),
validated offline (``gpufrac config validate``); ``config_json_schema`` gives its schema.
"""

from __future__ import annotations

import difflib
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from extender.cache import DEFAULT_STARVATION, DefragPolicy, StarvationPolicy
from extender.tenants import NO_TENANTS, Tenant, TenantPolicy
from scoring.arrivals import MAX_HALF_LIFE_PODS, Learning
from scoring.drift import DEFAULT_TOLERANCE, Tolerance
from scoring.presets import PRESETS
from scoring.registry import STRATEGIES
from scoring.request import MILLI_PER_GPU, QoSClass, QoSPolicy
from scoring.scorer import ScoringConfig, Ties, validate_config
from scoring.shape_prior import MAX_PRIOR_GPUS, MAX_PRIOR_WEIGHT, ShapePrior

_M = TypeVar("_M")


class ToleranceFile(BaseModel):
    """``scoring.tolerance:``: how far the cluster-wide terms may drift before every node is
    scored anew (``scoring.drift.Tolerance``; all 0: exact, a full pass per change)."""

    model_config = ConfigDict(extra="forbid")

    workload: float = Field(DEFAULT_TOLERANCE.workload, ge=0.0, le=1.0)
    # One field per strategy term (``TERM`` of ``scoring.strategies``; a test holds the two
    # lists equal): adaptive_balance's effective CPU pressure, spare_nodes' probabilities.
    cpu_pressure: float = Field(DEFAULT_TOLERANCE.of("cpu_pressure"), ge=0.0, allow_inf_nan=False)
    spare_need: float = Field(DEFAULT_TOLERANCE.of("spare_need"), ge=0.0, le=1.0)
    churn: float = Field(DEFAULT_TOLERANCE.of("churn"), ge=0.0, le=1.0)

    def tolerance(self) -> Tolerance:
        """As ``scoring.drift.Tolerance``."""
        terms = self.model_dump()
        return Tolerance(terms.pop("workload"), terms)


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
    (``scoring.shape_prior.ShapePrior``); a field left out keeps the preset's."""

    model_config = ConfigDict(extra="forbid")

    pods: int | None = Field(None, ge=0, le=1_000_000)
    """Pseudo-pods the prior is worth while few pods are observed (0 with floor 0: no prior)."""
    floor: float | None = Field(None, ge=0.0, le=0.5, allow_inf_nan=False)
    """Share of the counted pods the shapes not seen yet hold together."""
    shapes: list[PriorShapeFile] | None = Field(None, max_length=64)
    """Expected shapes; left out or empty: whole and half nodes of every node size, a whole
    GPU, half and a quarter of one."""


class LearningFile(BaseModel):
    """``scoring.learning:``: what the learned workload counts (``scoring.workload.Learning``);
    a field left out keeps the preset's."""

    model_config = ConfigDict(extra="forbid")

    learn_from: Literal["running", "arrivals"] | None = None
    """``running``: the GPU pods placed and waiting; ``arrivals``: each once, decayed, plus those waiting."""
    half_life_pods: int | None = Field(None, ge=1, le=MAX_HALF_LIFE_PODS)
    """Half-life of the arrival history, in GPU pods arrived."""


class ScoringFile(BaseModel):
    """``scoring:`` section of the admin config file."""

    model_config = ConfigDict(extra="forbid")

    preset: str = "default"
    weights: dict[str, float] = Field(default_factory=dict)
    qos_overrides: dict[str, dict[str, float]] = Field(default_factory=dict)
    tolerance: ToleranceFile = Field(default_factory=ToleranceFile)
    prior: PriorFile = Field(default_factory=PriorFile)
    learning: LearningFile = Field(default_factory=LearningFile)
    ties: Literal["keep_whole", "row"] | None = None
    """How nodes of equal score are ordered (``scoring.scorer.Ties``); left out: the preset's."""


class QosFile(BaseModel):
    """``qos:`` section: what each QoS class may share (``scoring.request.QoSPolicy``)."""

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


class StarvationFile(BaseModel):
    """``starvation:`` section: a node reserved for a GPU pod that waited too long
    (``extender.cache.reservations.StarvationPolicy``; on by default, off with
    ``reserve_after_s: 0``)."""

    model_config = ConfigDict(extra="forbid")

    reserve_after_s: float = Field(DEFAULT_STARVATION.reserve_after_s, ge=0, le=7 * 86_400)
    max_reserved_nodes: int = Field(DEFAULT_STARVATION.max_reserved_nodes, ge=1, le=10_000)
    reservation_ttl_s: float = Field(DEFAULT_STARVATION.reservation_ttl_s, gt=0, le=7 * 86_400)
    capacity_gate: bool = DEFAULT_STARVATION.capacity_gate


class DefragmentationFile(BaseModel):
    """``defragmentation:`` section: the plan of which running pods to move so that pods
    waiting for fragmentation fit (``extender.cache.defrag.DefragPolicy``); it is always made
    (cluster mode) and shown; acted on (evictions) only with ``evict: true``."""

    model_config = ConfigDict(extra="forbid")

    evict: bool = False
    evict_after_s: float = Field(600.0, ge=0, le=7 * 86_400)
    max_evictions_per_hour: int = Field(12, ge=1, le=10_000)
    plan_every_s: float = Field(30.0, ge=1, le=3600)


class AdminConfigFile(BaseModel):
    """The admin config file (YAML)."""

    model_config = ConfigDict(extra="forbid")

    scoring: ScoringFile = Field(default_factory=ScoringFile)
    qos: QosFile = Field(default_factory=QosFile)
    starvation: StarvationFile = Field(default_factory=StarvationFile)
    defragmentation: DefragmentationFile = Field(default_factory=DefragmentationFile)
    tenants: dict[str, TenantFile] = Field(default_factory=dict)
    default_tenant: str | None = None
    """Tenant of the namespaces no tenant lists; absent: those namespaces are not restricted."""
    tenant_label: Annotated[str, Field(min_length=1, max_length=317)] | None = None
    """A namespace label whose value is a tenant name (for namespaces not listed by name)."""


@dataclass(frozen=True)
class AdminConfig:
    """Everything the admin config decides, validated: scoring (weights, QoS rules) and tenants."""

    scoring: ScoringConfig
    tenants: TenantPolicy = NO_TENANTS
    tolerance: Tolerance = DEFAULT_TOLERANCE
    starvation: StarvationPolicy = DEFAULT_STARVATION
    defrag: DefragPolicy = DefragPolicy()


def config_json_schema() -> dict[str, Any]:
    """The admin config file's JSON Schema (draft 2020-12), for editors and the Helm chart's
    ``values.schema.json`` (its ``config`` value).

    ``AdminConfigFile``'s own schema, with what the model checks at run time written into it:
    the preset names, the strategy names a weight may carry (``scoring.strategies``), weights
    finite and >= 0, the QoS classes ``qos_overrides`` may name. What only ``load_admin_config`` can
    check (a ``default_tenant`` that names a tenant, a namespace listed by two tenants) stays
    with ``gpufrac config validate``.

    Returns
    -------
    dict
        A JSON-serialisable schema with its definitions under ``$defs``.
    """
    schema = AdminConfigFile.model_json_schema()
    weights = {"type": "object", "propertyNames": {"enum": sorted(STRATEGIES)},
               "additionalProperties": {"type": "number", "minimum": 0}}
    scoring = schema["$defs"]["ScoringFile"]["properties"]
    scoring["preset"] = {**scoring["preset"], "enum": sorted(PRESETS)}
    scoring["weights"] = {**scoring["weights"], **weights}
    scoring["qos_overrides"] = {**scoring["qos_overrides"], "propertyNames": {"enum": sorted(q.wire_name for q in QoSClass)},
                                "additionalProperties": weights}
    return schema


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
        learning=overrides.get("learning", base.learning),
    )
    if errors := validate_config(cfg):
        raise ConfigError("\n".join(errors))
    return cfg


def _tenant_policy(tenant_files: Mapping[str, TenantFile], default_tenant: str | None,
                   tenant_label: str | None, raw: Mapping[Any, Any], errors: list[str]) -> TenantPolicy:
    """The tenants that validated, and the errors between them (a namespace in two tenants,
    an unknown default) appended to ``errors``; ``raw``: the file's ``tenants`` mapping, whose
    namespace lists are compared even where a tenant has errors of its own."""
    qos = {q.wire_name: q for q in QoSClass}
    tenants = {
        name: Tenant(name, qos[t.qos_ceiling], t.quota.gpu_milli, t.quota.gpu_memory_mib)
        for name, t in tenant_files.items()
    }
    owner: dict[str, str] = {}
    for name, value in raw.items():
        listed = value.get("namespaces") if isinstance(value, Mapping) else None
        for i, ns in enumerate(listed if isinstance(listed, list) else []):
            if isinstance(ns, str) and ns in owner:
                errors.append(f"tenants.{name}.namespaces.{i}: namespace {ns!r} already belongs to tenant {owner[ns]!r}")
            elif isinstance(ns, str):
                owner[ns] = str(name)
    by_ns = {ns: tenants[t] for ns, t in owner.items() if t in tenants}
    known = sorted(str(n) for n in raw)
    default = tenants.get(default_tenant) if default_tenant is not None else None
    if default_tenant is not None and default_tenant not in known:
        errors.append(f"default_tenant: unknown tenant {default_tenant!r}; {_did_you_mean(default_tenant, known)}"
                      f"known: {', '.join(known) or '(none)'}")
    return TenantPolicy(by_ns, default, tenant_label, tenants)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _schema_errors(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> list[str]:
    """One line per schema error: key path, message, the value given, and for an unknown
    key the closest allowed one."""
    lines = []
    for e in exc.errors():
        loc = (*prefix, *e["loc"])
        where = ".".join(str(p) for p in loc) or "(root)"
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            lines.append(f"{where}: unknown key; {_did_you_mean(str(loc[-1]), allowed)}"
                         f"allowed here: {', '.join(allowed)}")
            continue
        given = repr(e.get("input"))
        given = given if len(given) <= 60 else given[:57] + "..."
        lines.append(f"{where}: {e['msg']} (got {given})")
    return lines


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys a config mapping at ``loc`` accepts (for did-you-mean); empty when unknown."""
    model: Any = AdminConfigFile
    free_key = False  # the next part is a key of a dict (a tenant's name) or a list index
    for part in loc:
        if free_key:
            free_key = False
            continue
        fields = getattr(model, "model_fields", None)
        field = fields.get(str(part)) if fields is not None else None
        if field is None:
            return []
        free_key = getattr(field.annotation, "__origin__", None) in (dict, list) or any(
            getattr(a, "__origin__", None) in (dict, list) for a in getattr(field.annotation, "__args__", ()))
        model = _model_of(field.annotation)
    return sorted(getattr(model, "model_fields", ()))


def _model_of(annotation: Any) -> Any:
    """The config model an annotation holds, if any (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _prior(base: ShapePrior, given: PriorFile) -> ShapePrior:
    """The preset's prior with the fields the config gives replaced."""
    shapes = base.shapes if given.shapes is None else tuple(
        (s.gpus, round(s.fraction * MILLI_PER_GPU), s.weight) for s in given.shapes)
    return ShapePrior(shapes, base.pods if given.pods is None else given.pods,
                      base.floor if given.floor is None else given.floor)


def _learning(base: Learning, given: LearningFile) -> Learning:
    """The preset's learning with the fields the config gives replaced."""
    return replace(base, **given.model_dump(exclude_none=True))


def parse_admin_config(text: str, source: str = "config") -> AdminConfig:
    """Validate the text of an admin config file.

    Parameters
    ----------
    text : str
        YAML.
    source : str
        Name for YAML syntax errors (the file path).

    Returns
    -------
    AdminConfig

    Raises
    ------
    ConfigError
        On invalid YAML or any invalid field, one ``field.path: message`` per line.
    """
    stream = io.StringIO(text)
    stream.name = source  # PyYAML names the stream in its messages ("<unicode string>" otherwise)
    try:
        raw = yaml.safe_load(stream) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        parsed = AdminConfigFile.model_validate(raw)
        errors: list[str] = []
    except ValidationError as exc:
        parsed = None
        errors = _schema_errors(exc)
    section = raw if isinstance(raw, Mapping) else {}

    # Every check that does not need the whole file valid runs anyway, on the sections that
    # validated, so one run reports every mistake.
    scoring: ScoringConfig | None = None
    raw_sc = section.get("scoring", {})
    raw_sc = raw_sc if isinstance(raw_sc, Mapping) else {}
    preset = raw_sc.get("preset", "default")
    if isinstance(preset, str) and preset not in PRESETS:
        errors.append(f"scoring.preset: unknown preset {preset!r}; {_did_you_mean(preset, PRESETS)}"
                      f"known: {', '.join(PRESETS)}")
    preset = preset if isinstance(preset, str) and preset in PRESETS else "default"  # weights still checked
    overrides: dict[str, Any] = {
        "weights": _valid(_WEIGHTS, raw_sc.get("weights", {})) or {},
        "qos_overrides": _valid(_QOS_OVERRIDES, raw_sc.get("qos_overrides", {})) or {},
        "prior": _prior(PRESETS[preset].prior, _valid(_PRIOR, raw_sc.get("prior", {})) or PriorFile()),
        "learning": _learning(PRESETS[preset].learning,
                              _valid(_LEARNING, raw_sc.get("learning", {})) or LearningFile())}
    if raw_sc.get("ties") in ("keep_whole", "row"):
        overrides["ties"] = raw_sc["ties"]
    try:
        scoring = scoring_config(preset, overrides)
    except ConfigError as exc:
        errors.extend(str(exc).splitlines())
    raw_tenants = section.get("tenants", {})
    raw_tenants = raw_tenants if isinstance(raw_tenants, Mapping) else {}
    tenant_files = {str(name): t for name, value in raw_tenants.items()
                    if (t := _valid(_TENANT, value)) is not None}
    default_tenant = section.get("default_tenant")
    tenants = _tenant_policy(tenant_files, default_tenant if isinstance(default_tenant, str) else None,
                             parsed.tenant_label if parsed is not None else None, raw_tenants, errors)
    if errors or parsed is None or scoring is None:
        raise ConfigError("\n".join(errors))
    policy = QoSPolicy(parsed.qos.isolate_guaranteed,
                       round(parsed.qos.best_effort_oversubscription * MILLI_PER_GPU))
    st, df = parsed.starvation, parsed.defragmentation
    return AdminConfig(replace(scoring, qos=policy), tenants, parsed.scoring.tolerance.tolerance(),
                       StarvationPolicy(st.reserve_after_s, st.max_reserved_nodes, st.reservation_ttl_s,
                                        st.capacity_gate),
                       DefragPolicy(df.evict, df.evict_after_s, df.max_evictions_per_hour, df.plan_every_s))


_WEIGHTS: TypeAdapter[dict[str, float]] = TypeAdapter(dict[str, float])
_QOS_OVERRIDES: TypeAdapter[dict[str, dict[str, float]]] = TypeAdapter(dict[str, dict[str, float]])
_PRIOR: TypeAdapter[PriorFile] = TypeAdapter(PriorFile)
_LEARNING: TypeAdapter[LearningFile] = TypeAdapter(LearningFile)
_TENANT: TypeAdapter[TenantFile] = TypeAdapter(TenantFile)


def _valid(adapter: TypeAdapter[_M], value: Any) -> _M | None:
    """``value`` validated by ``adapter``, or None when it does not validate (its errors
    are reported by the whole file's validation)."""
    try:
        return adapter.validate_python(value)
    except ValidationError:
        return None


def load_admin_config(path: Path) -> AdminConfig:
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
