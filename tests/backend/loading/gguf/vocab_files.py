"""Small real tokenizers for the GGUF tokenizer tests, trained here in well under a second, and GGUF files
holding their vocabularies the way llama.cpp's converter writes them."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFWriter, TokenType
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from backend.loading.gguf.weights import read_metadata

# Text of every kind the tests compare on; the trained vocabularies cover it only in part, so rare characters
# fall back to bytes.
CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # recursion\n",
    "for (int i = 0; i < 10; ++i) { total += values[i]; }\n\tif (x != y) return;\n",
    "中文分词测试：今天天气很好。日本語のテキスト、한국어 텍스트",
    "naïve café résumé Ångström façade, crème brûlée",
    "The year 2026 has 365 days; π ≈ 3.14159 and e ≈ 2.71828. Call 555-0100 before 10:30.",
    "emoji: 👋🏽 🚀✨ 🇫🇷 and more 🙂",
    "don't can't I'm we'll they've she'd IT'S",
    "    indented    with   runs   of   spaces\n\n\nand blank lines\r\n",
    "Привет мир, العربية, עברית, Ελληνικά",
]
TEXTS = [
    *CORPUS,
    "Hello world",
    " leading space and  double  spaces\tand a tab",
    "Line one\nLine two\r\n\nTrailing newline\n",
    "emoji: 👋🏽 🇫🇷 👨‍👩‍👧‍👦 🚀✨ 🦜",
    "http://example.com/path?q=1&r=two#frag 12345678",
    "    ",
    "",
    "unseen: ẞ ǅ ﬁ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 Ω",
]


def write_gguf(path: Path, arch: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A GGUF holding only `fields` (added as GGUFWriter's `add_<name>(value)`), read back as the loader reads it."""
    writer = GGUFWriter(str(path), arch)
    for name, value in fields.items():
        if value is not None:
            getattr(writer, f"add_{name}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return read_metadata(GGUFReader(path))


def train_sentencepiece(folder: Path, *, dummy_prefix: bool, vocab_size: int = 600) -> Path:
    """A byte-fallback SentencePiece BPE like Llama's, with a control and a user-defined symbol, as `tokenizer.model`."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=0.98,
        split_digits=True,
        add_dummy_prefix=dummy_prefix,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        control_symbols=["<|end|>"],
        user_defined_symbols=["<|user|>"],
        minloglevel=2,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return folder / "tokenizer.model"


def sentencepiece_fields(model_file: Path, added: dict[int, bool], *, add_bos: bool) -> dict[str, Any]:
    """The `tokenizer.ggml.*` fields llama.cpp's converter writes for a SentencePiece vocabulary; `added` maps the
    ids its tokenizer_config lists as added tokens to whether they are special (control) or user-defined."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        kind = TokenType.NORMAL
        if sp.is_unknown(i):
            kind = TokenType.UNKNOWN
        elif sp.is_control(i):
            kind = TokenType.CONTROL
        elif sp.is_unused(i):
            kind = TokenType.UNUSED
        elif sp.is_byte(i):
            kind = TokenType.BYTE
        if i in added:
            kind = TokenType.CONTROL if added[i] else TokenType.USER_DEFINED
        types.append(kind)
    return {
        "tokenizer_model": "llama",
        "tokenizer_pre": "default",
        "token_list": tokens,
        "token_scores": scores,
        "token_types": types,
        "bos_token_id": sp.bos_id(),
        "eos_token_id": sp.eos_id(),
        "unk_token_id": sp.unk_id(),
        "add_bos_token": add_bos,
        "add_eos_token": False,
    }


def train_byte_level_bpe(splits: tuple[str, ...] | None, specials: list[str], vocab_size: int = 700) -> Tokenizer:
    """A byte-level BPE trained on CORPUS with `splits` (regexes applied in turn; None: GPT-2's own)."""
    tokenizer = Tokenizer(models.BPE())
    if splits is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        steps: list[pre_tokenizers.PreTokenizer] = [
            pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits
        ]
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    return tokenizer


def byte_level_fields(tokenizer: Tokenizer, pre: str, control: list[str], user: list[str]) -> dict[str, Any]:
    """The fields llama.cpp's converter writes for a byte-level BPE: tokens by id, merges, types, `pre`."""
    import json

    model = json.loads(tokenizer.to_str())["model"]
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    types = [
        TokenType.CONTROL if t in control else TokenType.USER_DEFINED if t in user else TokenType.NORMAL for t in tokens
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return {
        "tokenizer_model": "gpt2",
        "tokenizer_pre": pre,
        "token_list": tokens,
        "token_types": types,
        "token_merges": merges,
        "bos_token_id": vocab[control[0]],
        "eos_token_id": vocab[control[1]],
        "add_bos_token": False,
    }
