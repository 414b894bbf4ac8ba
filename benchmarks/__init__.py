"""One-off measurements behind the figures in docs/benchmarks.md, docs/benchmarks-history.md and docs/gpu.md, run as
`python -m benchmarks.NAME`; they build on the product (`tidegate bench`) but are not part of it."""
