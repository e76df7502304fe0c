"""Benchmarks: run workloads on engines side by side and report frequencies, throughput and stage costs."""
