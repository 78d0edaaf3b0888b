"""The only bridge between Kubernetes JSON and the numpy core, one module per direction:
``inbound`` (request -> scoring request) and ``outbound`` (decision -> reply). Parsing a Pod
or Node object itself is ``podspec``'s."""
