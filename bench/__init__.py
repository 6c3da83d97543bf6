"""Benchmarks: the Pathways paper's experiments and their peers, side by side.

`python -m bench.run` (or `make bench` / `make bench-quick`) runs every
experiment and writes `bench/results/<date>.json` and `bench/RESULTS.md`.
Every figure is a ratio against a baseline measured in the same run, with the
median and spread over repeats: these machines are shared and noisy, so
absolute times mean little and nothing here is asserted by a test.
"""
