"""Parallelism: device meshes of named axes, strategies as ordered tactics and tables, and the shardings built from them."""
