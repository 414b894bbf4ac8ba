"""Turns files into what the engine runs: GGUF and safetensors weights, tokenizer, chat template, model cache."""
