"""Benchmarks: each is ``python -m benchmarks.<name>`` and ``main(argv) -> dict``, through :mod:`.harness`."""
