"""Cluster mode (extender/cluster/): the watches, the bind, the defragmenter, quarantine."""
