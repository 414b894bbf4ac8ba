"""Random-weight models in the real shapes of the models users run, as HF folders and GGUF files, cached.

    python -m benchmarks.backend.real_shapes qwen2.5-0.5b [--cache DIR] [--llama-quantize PATH]

Each shape is its model's real `config.json` (hidden size, layers, heads, vocabulary, RoPE); the weights are
random (normal, std 0.02; norms 1) and the tokenizer is SmolLM2's, from the default model, filled up to the
vocabulary with ordinary tokens (each the text of two of SmolLM2's), so that every id a random model samples is
text in both servers, as in the real vocabulary: unused padding renders as nothing, and a client would see the
first token only at the first sampled id that is text. The folder is converted by `backend.loading.gguf.writer`;
the Q4_K_M file is made by llama.cpp's own `llama-quantize` from an F16 conversion when given its path (the same
file then serves both servers), else by the converter's Q4_K_M recipe (Q4_0/Q5_0/Q8_0 where the recipe says a K
type: the installed `gguf` package has no K quantizer). Benchmark only: never in CI.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import gguf
import torch
from safetensors.torch import save_file

from backend.loading.gguf.weights import read_metadata
from backend.loading.gguf.writer import convert
from backend.loading.hf_vocab import save_gguf_tokenizer
from backend.loading.model_cache import resolve

CACHE = Path("~/.cache/tidegate/real-shapes").expanduser()
_FULL_VOCABULARY = "full-vocabulary"  # marks a folder whose tokenizer has a token for every id

# From the models' own config.json (Qwen/Qwen2.5-0.5B-Instruct, meta-llama/Llama-3.2-1B-Instruct).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "sliding_window": 32768, "use_sliding_window": False,
        "max_window_layers": 21, "torch_dtype": "bfloat16",
    },
    "llama3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rms_norm_eps": 1e-05, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "bfloat16",
    },
}


def random_weights(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of the shape's checkpoint, bfloat16 as the real ones are."""
    gen = torch.Generator().manual_seed(seed)
    hidden, ffn, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_rows, kv_rows = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen) * 0.02).to(torch.bfloat16)

    state = {"model.embed_tokens.weight": matrix(vocab, hidden), "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state |= {p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                  p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                  p + "self_attn.q_proj.weight": matrix(q_rows, hidden), p + "self_attn.k_proj.weight": matrix(kv_rows, hidden),
                  p + "self_attn.v_proj.weight": matrix(kv_rows, hidden), p + "self_attn.o_proj.weight": matrix(hidden, q_rows),
                  p + "mlp.gate_proj.weight": matrix(ffn, hidden), p + "mlp.up_proj.weight": matrix(ffn, hidden),
                  p + "mlp.down_proj.weight": matrix(hidden, ffn)}
        if config["model_type"] == "qwen2":  # Qwen2 has biases on Q, K and V
            for name, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
                state[p + f"self_attn.{name}_proj.bias"] = matrix(1, rows)[0]
    if not config["tie_word_embeddings"]:
        state["lm_head.weight"] = matrix(vocab, hidden)
    return state


def hf_folder(name: str, cache: Path = CACHE) -> Path:
    """The shape's folder (config.json, model.safetensors, SmolLM2's tokenizer), built once."""
    folder = cache / name / "hf"
    if (folder / "model.safetensors").exists() and (folder / _FULL_VOCABULARY).exists():
        return folder
    if folder.exists():  # built before the vocabulary was filled: its GGUF files have unused tokens too
        shutil.rmtree(cache / name)
    folder.mkdir(parents=True, exist_ok=True)
    save_gguf_tokenizer(read_metadata(gguf.GGUFReader(resolve("smollm2"))), folder)
    _fill_vocabulary(folder / "tokenizer.json", SHAPES[name]["vocab_size"])
    (folder / _FULL_VOCABULARY).touch()
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    tokens = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    ids = {key: tokens.get(settings.get(f"{key}_token")) for key in ("bos", "eos")}
    config = {**SHAPES[name], "bos_token_id": ids["bos"], "eos_token_id": ids["eos"]}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file(random_weights(config), str(folder / "model.safetensors.partial"))
    (folder / "model.safetensors.partial").rename(folder / "model.safetensors")  # a crash leaves no half file
    return folder


def _fill_vocabulary(path: Path, size: int) -> None:
    """Give every id up to `size` an ordinary token: the text of two of the vocabulary's own (no merge makes it,
    so encoding never does; decoding gives that text)."""
    data = json.loads(path.read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    added = {int(t["id"]) for t in data.get("added_tokens", [])}
    words = [tok for tok, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i not in added]
    taken = set(vocab) | {t["content"] for t in data.get("added_tokens", [])}
    step = 0
    for i in range(max([*vocab.values(), *added]) + 1, size):
        while (token := _pair(words, step)) in taken:
            step += 1
        vocab[token] = i
        taken.add(token)
        step += 1
    path.write_text(json.dumps(data, ensure_ascii=False))


def _pair(words: list[str], step: int) -> str:
    """Two words of the list, a different pair for every step up to len(words) squared."""
    n = len(words)
    first = step % n
    return words[first] + words[(first * 7919 + step // n + 1) % n]


def q4_k_m_file(name: str, cache: Path = CACHE, llama_quantize: str | None = None) -> Path:
    """The shape's Q4_K_M GGUF: llama.cpp's quantizer's when `llama_quantize` is given, else the converter's."""
    folder = hf_folder(name, cache)
    if llama_quantize is None:
        return _once(cache / name / "Q4_K_M-like.gguf", lambda out: convert(folder, out, "Q4_K_M"))
    f16 = _once(cache / name / "F16.gguf", lambda out: convert(folder, out, "F16"))
    with open(cache / name / "llama-quantize.log", "wb") as log:  # its per-tensor report, kept beside the file
        return _once(cache / name / "Q4_K_M.gguf",
                     lambda out: subprocess.run([llama_quantize, str(f16), str(out), "Q4_K_M"], check=True,
                                                stdout=log, stderr=subprocess.STDOUT))


def _once(path: Path, make: Any) -> Path:
    if not path.exists():
        partial = path.with_suffix(".partial.gguf")
        make(partial)
        partial.rename(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shapes", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--llama-quantize", help="llama.cpp's llama-quantize binary, for a real Q4_K_M")
    args = parser.parse_args()
    for name in args.shapes.split(","):
        print(q4_k_m_file(name, args.cache, args.llama_quantize))


if __name__ == "__main__":
    main()
