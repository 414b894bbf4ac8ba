"""Runs the model: the runner, the Llama model, attention backends, kernels, CUDA graphs, the sampler."""
