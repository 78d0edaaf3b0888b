"""gpufrac's Kubernetes side: the scheduler-extender HTTP server, its cache and translation."""
