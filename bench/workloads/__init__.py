"""Workloads W1-W4 and the micro-benchmarks."""
