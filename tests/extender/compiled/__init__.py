"""The compiled score functions (extender.compiled) against the numpy reference."""
