"""Sweeps: expand a grid of configurations, run each in its own process and keep the results in SQLite."""
