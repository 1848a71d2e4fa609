"""Side-by-side benchmark of skiplock against PgQueuer, Procrastinate and a raw SKIP LOCKED loop.

Run it with ``python -m tests.benchmarks.run`` from the repository root; see README.md.
"""
