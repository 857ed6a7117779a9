"""Prefix every line of a child's output with ``[rank=N] `` (standard library only)."""
