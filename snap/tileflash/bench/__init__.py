"""Benchmarks and demos for tileflash (``tileflash demo``; ``tileflash bench`` to come)."""
