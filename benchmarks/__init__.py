"""corral's benchmark suite: corral against the transport floor and openenv-core.

Run ``python -m benchmarks`` (see :mod:`benchmarks.suite`); the figures of the last full
run are in ``benchmarks/RESULTS.md``.
"""
