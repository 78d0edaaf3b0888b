"""The node agent (``gpufrac-agent``): NVML inventory, health and usage, published for the extender."""
