"""The extender's cache (extender/cache/): evaluation, assume, reservations, the defrag plan."""
