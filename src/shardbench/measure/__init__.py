"""Measurements of a run: time, FLOPs and MFU, memory, communication."""
