"""The agent as a Dynamic Resource Allocation driver (``gpu.gpufrac.io``): the node's GPUs
published as a ResourceSlice (``slice``, ``slice_publisher``). Preparing claims for kubelet
(the DRA gRPC service) is not built yet: docs/dra.md says what is and is not."""
