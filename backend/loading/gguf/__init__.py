"""GGUF files: reading their header and tensors (`reader`), turning them into the model's weights and config
(`weights`), their tokenizer metadata as a `tokenizers` tokenizer (`tokenizer/`), and writing an HF folder as
GGUF (`writer`). The third-party `gguf` package supplies the format's constants and quantizers."""
