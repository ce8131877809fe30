"""Parallelism: device meshes, strategies as logical-axis rule tables, and shardings built from them."""
