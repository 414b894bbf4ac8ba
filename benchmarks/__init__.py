"""One-off measurements behind the figures in docs/benchmarks.md, docs/benchmarks-history.md and docs/gpu.md, run as
`python -m benchmarks.CONCERN.NAME` from the repository root; they build on the product (`tidegate bench`) but are
not part of it. `backend/`: the inference backend (engine, model, kernels, server); `gateway/`: the gateway and the
stack around it (admission, routing, batch, autoscaling); `gpu/`: the NVIDIA GPU check and its phases."""
