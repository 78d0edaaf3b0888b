"""The ``kubernetes`` client as gpufrac's products use it: ``kube_api`` builds it, and two
functions read its responses when called with ``_preload_content=False``.

gpufrac asks the client for raw responses (plain API JSON for ``podspec``, and no model
deserialization). Such a response holds its pooled TLS connection until its body is read
and the connection released; one left unread makes the next call open a new connection
and pay a handshake. Every raw call goes through one of these two functions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson


def response_json(resp: Any) -> dict[str, Any]:
    """Body of a raw response as JSON, its connection given back to the pool."""
    data = resp.data
    resp.release_conn()
    body = orjson.loads(data)
    if not isinstance(body, dict):
        raise ValueError(f"API response is not a JSON object: {type(body).__name__}")
    return body


def drain(resp: Any) -> None:
    """Read and release a raw response whose body is not needed."""
    resp.data  # noqa: B018 - reading the body is what frees the connection
    resp.release_conn()


def kube_api(kubeconfig: Path | None) -> Any:
    """CoreV1Api from a kubeconfig file; without one, the in-cluster service account in a pod
    (``$KUBERNETES_SERVICE_HOST`` set), else ``$KUBECONFIG`` or ``~/.kube/config``.

    Raises ``kubernetes.config.config_exception.ConfigException`` when none of them gives
    credentials.

    The connection pool is sized for concurrent binds (each makes two API calls from its own
    worker thread): with the client's default of 5 x CPUs, a burst of binds opens and
    discards extra TLS connections, which costs more than the calls themselves.
    """
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:  # $KUBECONFIG read now, not when the client module was imported
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg)
    cfg.connection_pool_maxsize = 64
    return client.CoreV1Api(client.ApiClient(cfg))
