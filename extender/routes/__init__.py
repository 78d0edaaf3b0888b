"""HTTP routes: thin handlers that parse the wire model, call the cache, answer."""
