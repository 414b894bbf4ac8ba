"""What the inference backend costs: its engine, model, CPU kernels and server, against transformers and llama.cpp."""
