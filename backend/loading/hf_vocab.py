"""A Hugging Face folder's byte-level BPE tokenizer (`tokenizer.json`, `tokenizer_config.json`) as GGUF
`tokenizer.ggml.*` metadata, as llama.cpp's converter writes it; and the reverse, a GGUF file's vocabulary saved as
those files (to build a folder around a known tokenizer)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from backend.executor.model.config import UnsupportedModelError
from backend.loading.gguf.tokenizer import build_gguf_tokenizer
from backend.loading.gguf.tokenizer.pretokenizers import PRE_SPLITS

log = logging.getLogger(__name__)

_GPT2_SPLIT = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


@dataclass(slots=True)
class GGUFVocab:
    """What a GGUF file says of its tokenizer (`tokenizer.ggml.model` "gpt2": byte-level BPE)."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str  # llama.cpp's name of the split before merging (gguf/tokenizer/pretokenizers.py)
    bos_id: int | None
    eos_id: int | None
    add_bos: bool = False
    chat_template: str | None = None

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.token_types), "one type per token"

    def add_to(self, writer: gguf.GGUFWriter) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.token_types)
        writer.add_token_merges(self.merges)
        if self.bos_id is not None:
            writer.add_bos_token_id(self.bos_id)
        if self.eos_id is not None:
            writer.add_eos_token_id(self.eos_id)
        writer.add_add_bos_token(self.add_bos)
        if self.chat_template:
            writer.add_chat_template(self.chat_template)


def vocab_from_hf_folder(folder: Path, vocab_size: int, config: dict[str, Any]) -> GGUFVocab:
    """The folder's tokenizer, its ids padded with unused `[PAD{i}]` tokens up to the model's `vocab_size`."""
    data = json.loads((folder / "tokenizer.json").read_text())
    model = data.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise UnsupportedModelError(
            f"tokenizer.json model {model.get('type')!r} is not a byte-level BPE; only those are converted "
            "(use llama.cpp's convert_hf_to_gguf.py for SentencePiece vocabularies)")
    added = {int(t["id"]): t for t in data.get("added_tokens", [])}
    by_id = {int(i): tok for tok, i in model["vocab"].items()} | {i: t["content"] for i, t in added.items()}
    size = max(vocab_size, max(by_id) + 1)
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    types = [
        (_CONTROL if added[i].get("special") else _USER_DEFINED) if i in added
        else _NORMAL if i in by_id else _UNUSED
        for i in range(size)
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    settings = _tokenizer_config(folder)
    ids = {tok: i for i, tok in enumerate(tokens)}
    return GGUFVocab(
        tokens=tokens, token_types=types, merges=merges, pre=_pre_name(data.get("pre_tokenizer")),
        bos_id=_special_id(settings.get("bos_token"), ids, config.get("bos_token_id")),
        eos_id=_special_id(settings.get("eos_token"), ids, config.get("eos_token_id")),
        add_bos=bool(settings.get("add_bos_token", _post_processor_adds_bos(data.get("post_processor")))),
        chat_template=_chat_template(folder, settings),
    )


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _special_id(token: Any, ids: dict[str, int], fallback: Any) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    if isinstance(token, str) and token in ids:
        return ids[token]
    if isinstance(fallback, list):  # config.json may list several EOS ids; the first is the canonical one
        fallback = fallback[0] if fallback else None
    return int(fallback) if fallback is not None else None


def _post_processor_adds_bos(post: dict[str, Any] | None) -> bool:
    # Llama 3's tokenizer.json adds BOS in its TemplateProcessing instead of setting add_bos_token.
    single = (post or {}).get("single") or []
    return bool(single) and "SpecialToken" in single[0]


def _chat_template(folder: Path, settings: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    template = settings.get("chat_template")
    if isinstance(template, list):  # named templates: the default one serves chat
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def _pre_name(pre: dict[str, Any] | None) -> str:
    """llama.cpp's name for the splits tokenizer.json applies, matched against the table the loader reads."""
    splits: list[str] = []
    for step in (pre or {}).get("pretokenizers", [pre] if pre else []):
        kind = step.get("type")
        if kind == "Split":
            splits.append(step["pattern"].get("Regex") or step["pattern"].get("String"))
        elif kind == "Digits" and step.get("individual_digits"):
            splits.append(r"\p{N}")
        elif kind == "ByteLevel" and step.get("use_regex", True):
            splits.append(_GPT2_SPLIT)
    found = tuple(splits)
    for name, known in PRE_SPLITS.items():
        if (known or (_GPT2_SPLIT,)) == found:
            return name
    log.warning("tokenizer.json splits text in a way llama.cpp has no name for; writing tokenizer.ggml.pre 'default'")
    return "default"


def save_gguf_tokenizer(meta: dict[str, Any], folder: Path) -> None:
    """A GGUF file's tokenizer (its metadata, `gguf.weights.read_metadata`) as `tokenizer.json` and
    `tokenizer_config.json` in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    build_gguf_tokenizer(meta).save(str(folder / "tokenizer.json"))
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    settings: dict[str, Any] = {"add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False))}
    for key in ("bos", "eos"):
        if meta.get(f"tokenizer.ggml.{key}_token_id") is not None:
            settings[f"{key}_token"] = tokens[int(meta[f"tokenizer.ggml.{key}_token_id"])]
    if meta.get("tokenizer.chat_template"):
        settings["chat_template"] = meta["tokenizer.chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, ensure_ascii=False, indent=1))
