"""Tenants inside the cache: the GPU share and memory each namespace holds, the namespaces'
labels, and the admission check of a pod against its tenant's rules (``extender.tenants``).

Not thread-safe on its own: ``GpuCache`` owns one and calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable

from extender.tenants import NO_TENANTS, Tenant, TenantPolicy, Usage
from podspec.pods import PodIntent
from scoring.specs import Allocation


class TenantLedger:
    """Per-namespace GPU usage and namespace labels, judged by a ``TenantPolicy``.

    Attributes
    ----------
    tenant_policy : TenantPolicy
        The admin config's tenants (swapped on a config reload).
    """

    def __init__(self, tenant_policy: TenantPolicy = NO_TENANTS) -> None:
        self.tenant_policy = tenant_policy
        # GPU share (milli) and memory (MiB) held per namespace, for tenant quotas.
        self._usage: dict[str, list[int]] = {}
        # Namespace labels (cluster mode: the namespace watch), for the tenant label.
        self._labels: dict[str, dict[str, str]] = {}

    def tenant(self, namespace: str) -> Tenant | None:
        """The namespace's tenant (listed, labelled or default); None when unrestricted."""
        return self.tenant_policy.tenant(namespace, self._labels.get(namespace))

    def usage(self, namespaces: Iterable[str] | None = None) -> Usage:
        """GPU share and memory held by the pods of ``namespaces`` (None: every namespace)."""
        keys = self._usage if namespaces is None else namespaces
        rows = [self._usage.get(ns, [0, 0]) for ns in keys]
        return Usage(sum(r[0] for r in rows), sum(r[1] for r in rows))

    def tenant_usage(self, namespace: str) -> Usage:
        """What the namespace's tenant holds over all its namespaces (nothing when unrestricted)."""
        tenant = self.tenant(namespace)
        if tenant is None:
            return Usage()
        return self.usage([ns for ns in self._usage if self.tenant(ns) is tenant])

    def by_tenant(self) -> dict[str, tuple[Tenant, Usage]]:
        """Every tenant of the policy (listed, named or default) with what its namespaces hold."""
        tenants = {t.name: t for t in (*self.tenant_policy.by_namespace.values(), *self.tenant_policy.by_name.values(),
                                       *(() if self.tenant_policy.default is None else (self.tenant_policy.default,)))}
        held: dict[str, list[int]] = {name: [0, 0] for name in tenants}
        for ns, (milli, mib) in self._usage.items():
            tenant = self.tenant(ns)
            if tenant is not None:
                row = held.setdefault(tenant.name, [0, 0])
                tenants.setdefault(tenant.name, tenant)
                row[0] += milli
                row[1] += mib
        return {name: (tenants[name], Usage(*row)) for name, row in held.items()}

    def admission(self, intent: PodIntent, gpu_memory_mib: int, gpu_milli_total: int | None = None) -> str | None:
        """``TenantPolicy.admit`` for the pod against its tenant's current usage: None when
        admitted, else the user-facing reason. ``gpu_milli_total``: the pod's total share
        (``gpu_count x gpu_milli`` when None; a recorded allocation's own otherwise)."""
        total = intent.gpu_count * intent.gpu_milli if gpu_milli_total is None else gpu_milli_total
        return self.tenant_policy.admit(intent.namespace, intent.qos, total, gpu_memory_mib,
                                 self.tenant_usage(intent.namespace), self._labels.get(intent.namespace))

    def apply(self, namespace: str, alloc: Allocation, sign: int = 1) -> None:
        """Count (``sign`` 1) or free (-1) an allocation's GPU share and memory for the namespace."""
        if alloc.gpu_cols:
            use = self._usage.setdefault(namespace, [0, 0])
            use[0] += sign * alloc.gpu_milli * len(alloc.gpu_cols)
            use[1] += sign * sum(alloc.gpu_memory_mib)

    def clear_usage(self) -> None:
        """Forget every namespace's usage (the cache counts every allocation again)."""
        self._usage = {}

    def set_labels(self, labels: dict[str, dict[str, str]]) -> None:
        """Every namespace's labels (a full list, from the namespace watch)."""
        self._labels = {ns: dict(lb) for ns, lb in labels.items()}

    def upsert_labels(self, name: str, labels: dict[str, str] | None) -> None:
        """One namespace's labels changed (None: it was deleted)."""
        if labels is None:
            self._labels.pop(name, None)
        else:
            self._labels[name] = dict(labels)
