"""The NVIDIA GPU check (`benchmarks/gpu/check.sh`) and its phases: Triton kernels, fusions, decode, throughput."""
