"""The ``kubernetes`` client as gpufrac's products use it: ``kube_api`` builds it, two
functions read its responses when called with ``_preload_content=False``, and ``write_json``
sends a hot-path write on its connection pool and credentials without its model layer.

gpufrac asks the client for raw responses (plain API JSON for ``podspec``, and no model
deserialization). Such a response holds its pooled TLS connection until its body is read
and the connection released; one left unread makes the next call open a new connection
and pay a handshake. Every raw call goes through one of these two functions.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import Any

import orjson

WRITE_TIMEOUT_S = 30.0
"""Default connect plus read limit of one ``write_json`` call, seconds: a write the API
server does not answer fails instead of holding a worker thread forever."""


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


def core_path(*segments: str) -> str:
    """Path of a core/v1 resource: ``core_path("namespaces", ns, "pods", name, "binding")``.
    Every segment is percent-quoted, so a name from a request body stays one segment."""
    return "/api/v1/" + "/".join(urllib.parse.quote(s, safe="") for s in segments)


def write_json(api: Any, method: str, path: str, body: Any, timeout_s: float = WRITE_TIMEOUT_S) -> dict[str, Any]:
    """Send one JSON write (``POST``/``PUT``) through ``api``'s connection pool and credentials.

    The same request the client's typed call makes, without its parameter and model
    handling: on the development machine a Binding costs the client 1.3-1.5 ms of CPU and
    this 0.8-1.1 ms (httpx with a kept-alive pool: 1.6 ms); docs/decisions/0012.

    Parameters
    ----------
    api : kubernetes.client.CoreV1Api
        From ``kube_api``; its configuration gives host, TLS and the bearer token (read
        again on every call when the configuration refreshes it, as in a pod).
    method : str
        ``"POST"`` or ``"PUT"``.
    path : str
        API path, e.g. ``/api/v1/namespaces/ns/pods/name/binding``.
    body : object
        JSON-serializable body (``orjson``).
    timeout_s : float
        Connect plus read limit, seconds.

    Returns
    -------
    dict
        The response body (a ``Status`` or the written object); empty when not JSON.

    Raises
    ------
    kubernetes.client.rest.ApiException
        The API server answered outside 2xx (``status``, ``reason`` and ``body`` as the
        client sets them), or no answer came (``status`` 0, the connection error as reason).
    """
    import urllib3
    from kubernetes.client.rest import ApiException

    client = api.api_client
    cfg = client.configuration
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if client.default_headers:
        headers.update(client.default_headers)
    for auth in cfg.auth_settings().values():
        if auth.get("in") == "header" and auth.get("value"):
            headers[auth["key"]] = auth["value"]
    try:
        resp = client.rest_client.pool_manager.request(
            method, cfg.host + path, body=orjson.dumps(body), headers=headers,
            timeout=urllib3.Timeout(total=timeout_s))
    except urllib3.exceptions.HTTPError as exc:
        raise ApiException(status=0, reason=f"no answer from the API server: {exc}") from None
    if not 200 <= resp.status <= 299:
        refused = ApiException(status=resp.status, reason=resp.reason)
        refused.body = resp.data
        raise refused
    try:
        got = orjson.loads(resp.data)
    except orjson.JSONDecodeError:
        return {}
    return got if isinstance(got, dict) else {}


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
