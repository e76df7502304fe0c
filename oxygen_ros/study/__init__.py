"""Study and test helpers around the engine: language workloads, extra action heads, the uncached reference.

The benchmarks and the tests use them; no production room imports them (pyproject.toml's contracts).
"""
