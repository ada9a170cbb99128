"""`specc bench`: end-to-end tokens/s of AR baselines and specc's systems, the cost model beside.

``run_bench(BenchOptions)`` -> a JSON-ready report; ``specc.bench.report`` prints the table and
writes JSON and PNG plots. At real shapes with random weights, acceptance is replayed from a
stated model (``specc.bench.acceptance``, ``specc.runtime.replay``). docs/benchmarks/README.md
says how to read the output.
"""

from specc.bench.run import ALL_SYSTEMS, BenchOptions, run_bench

__all__ = ["ALL_SYSTEMS", "BenchOptions", "run_bench"]
