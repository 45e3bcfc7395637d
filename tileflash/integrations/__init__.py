"""Integrations of tileflash with other libraries (each imports its library only when imported)."""
