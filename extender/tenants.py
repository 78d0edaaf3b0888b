"""Tenants: which namespaces belong to whom, the best QoS class each may ask for, GPU quotas.

The admin config maps namespaces to tenants: by name (``tenants.<name>.namespaces``), else by
a namespace label whose value is the tenant's name (``tenant_label``, cluster mode: the
namespaces are watched), else ``default_tenant``. A pod may
ask for its tenant's ``qos_ceiling`` or a lower class, never a higher one; a tenant's GPU
pods together hold at most its ``quota`` (sum of GPU shares, sum of GPU memory). Both rules
are admission checks: ``TenantPolicy.admit`` answers with a user-facing message or None, and
the cache calls it in filter (every candidate fails with the message) and again at bind under
its lock (two pods racing for the last quota cannot both get it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scoring.request import MILLI_PER_GPU, QoSClass


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant.

    Parameters
    ----------
    name : str
    qos_ceiling : QoSClass
        The best class its pods may ask for (``GUARANTEED`` allows every class).
    quota_gpu_milli : int or None
        Sum of ``gpu_count x gpu_milli`` over its bound GPU pods, milli-GPU; None: no limit.
    quota_gpu_memory_mib : int or None
        Sum of the GPU memory its bound GPU pods hold, MiB; None: no limit.
    """

    name: str
    qos_ceiling: QoSClass = QoSClass.GUARANTEED
    quota_gpu_milli: int | None = None
    quota_gpu_memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """What a namespace's bound GPU pods hold: share (milli-GPU) and GPU memory (MiB)."""

    gpu_milli: int = 0
    gpu_memory_mib: int = 0


@dataclass(frozen=True)
class TenantPolicy:
    """Namespace -> tenant, and the admission rules (built once from the admin config).

    Parameters
    ----------
    by_namespace : mapping of str to Tenant
    default : Tenant or None
        The tenant of namespaces not listed; None: such namespaces are not restricted.
    label_key : str or None
        A namespace label whose value names its tenant (for namespaces not listed by name).
    by_name : mapping of str to Tenant
        Every tenant by name (what a ``label_key`` value refers to).
    """

    by_namespace: Mapping[str, Tenant] = field(default_factory=dict)
    default: Tenant | None = None
    label_key: str | None = None
    by_name: Mapping[str, Tenant] = field(default_factory=dict)

    def tenant(self, namespace: str, labels: Mapping[str, str] | None = None) -> Tenant | None:
        """The namespace's tenant, or None when it has none (no rule applies).

        Parameters
        ----------
        namespace : str
        labels : mapping of str to str, optional
            The namespace's labels; a ``label_key`` value naming no tenant is ignored.
        """
        listed = self.by_namespace.get(namespace)
        if listed is not None:
            return listed
        if self.label_key is not None and labels:
            named = self.by_name.get(labels.get(self.label_key, ""))
            if named is not None:
                return named
        return self.default

    def admit(self, namespace: str, qos: QoSClass, gpu_milli: int, gpu_memory_mib: int,
              usage: Usage, labels: Mapping[str, str] | None = None) -> str | None:
        """Whether a pod may be placed; the reason when it may not.

        Parameters
        ----------
        namespace : str
        qos : QoSClass
            The class the pod asks for.
        gpu_milli : int
            The pod's total share, ``gpu_count x gpu_milli``, milli-GPU (0 for a CPU-only pod).
        gpu_memory_mib : int
            GPU memory the pod will hold in total, MiB (its request, or a lower bound when it
            asks for a proportional share: the quota is checked again with the exact value at
            bind).
        usage : Usage
            What the tenant's pods hold now.
        labels : mapping of str to str, optional
            The namespace's labels (``tenant``).

        Returns
        -------
        str or None
            None when admitted; else the message for kube-scheduler's FailedScheduling event.
        """
        tenant = self.tenant(namespace, labels)
        if tenant is None or gpu_milli == 0:
            return None
        if qos < tenant.qos_ceiling:
            return (f"gpufrac: tenant {tenant.name!r} may ask for QoS class "
                    f"{tenant.qos_ceiling.wire_name} or lower; the pod asks for {qos.wire_name}")
        q = tenant.quota_gpu_milli
        if q is not None and usage.gpu_milli + gpu_milli > q:
            return (f"gpufrac: tenant {tenant.name!r} over GPU quota: holds "
                    f"{usage.gpu_milli / MILLI_PER_GPU:g} GPU, the pod asks for "
                    f"{gpu_milli / MILLI_PER_GPU:g}, quota {q / MILLI_PER_GPU:g}")
        q = tenant.quota_gpu_memory_mib
        if q is not None and usage.gpu_memory_mib + gpu_memory_mib > q:
            return (f"gpufrac: tenant {tenant.name!r} over GPU memory quota: holds "
                    f"{usage.gpu_memory_mib}Mi, the pod asks for {gpu_memory_mib}Mi, quota {q}Mi")
        return None


NO_TENANTS = TenantPolicy()
"""No tenants configured: every pod is admitted."""
