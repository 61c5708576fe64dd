"""Benchmarks of fsm_engine against its peers (see bench/run.py and bench/RESULTS.md)."""
