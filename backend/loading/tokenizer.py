"""Tokenizer (from GGUF metadata or `tokenizer.json`) and streaming detokenisation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from backend.loading.chat_template import ChatTemplate
from backend.loading.gguf.tokenizer import UNUSED, build_gguf_tokenizer, byte_alphabet

# Tokens that end a turn in common chat formats: generation stops on them as on EOS (as llama.cpp does).
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>", "<end_of_turn>", "</s>")


class Tokenizer:
    """Text <-> token ids, special tokens and the chat template of one model."""

    def __init__(
        self,
        backend: _HFTokenizer,
        *,
        bos_token: str | None,
        eos_token: str | None,
        add_bos_token: bool,
        add_eos_token: bool = False,
        chat_template: str | None,
        max_context: int,
        extra_special: dict[str, str | None] | None = None,
        extra_eos_ids: tuple[int, ...] = (),
        unused_ids: frozenset[int] = frozenset(),
    ) -> None:
        self._backend = backend
        # Ids a GGUF marks unused (vocabulary padding, reserved slots) are never text, as llama.cpp renders them;
        # spelled out, "[PAD151000]" would come back as a dozen tokens in the next turn's history.
        self._unused = unused_ids
        self.bos_token_id: int | None = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_id: int | None = backend.token_to_id(eos_token) if eos_token else None
        self._add_bos = add_bos_token and self.bos_token_id is not None
        self._add_eos = add_eos_token and self.eos_token_id is not None
        end_of_turn = {backend.token_to_id(t) for t in _END_OF_TURN}
        eos = {self.eos_token_id, *extra_eos_ids} | end_of_turn
        self.eos_token_ids: frozenset[int] = frozenset(i for i in eos if i is not None)
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.max_context = max_context
        special = {"bos_token": bos_token, "eos_token": eos_token, **(extra_special or {})}
        self.chat_template: ChatTemplate | None = ChatTemplate(chat_template, special) if chat_template else None

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], max_context: int) -> Tokenizer:
        """Build from `tokenizer.ggml.*` keys, as transformers' GGUF loader does."""
        backend = build_gguf_tokenizer(meta)
        tokens: list[str] = meta["tokenizer.ggml.tokens"]

        def token(key: str) -> str | None:
            idx = meta.get(f"tokenizer.ggml.{key}")
            return tokens[int(idx)] if idx is not None and 0 <= int(idx) < len(tokens) else None

        return cls(
            backend,
            bos_token=token("bos_token_id"),
            eos_token=token("eos_token_id"),
            # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise.
            add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", meta["tokenizer.ggml.model"] == "llama")),
            add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            chat_template=meta.get("tokenizer.chat_template"),
            max_context=max_context,
            extra_special={"unk_token": token("unknown_token_id"), "pad_token": token("padding_token_id")},
            unused_ids=frozenset(i for i, t in enumerate(meta.get("tokenizer.ggml.token_type") or []) if t == UNUSED),
        )

    @classmethod
    def from_hf_folder(cls, folder: Path, max_context: int) -> Tokenizer:
        """Build from `tokenizer.json`, `tokenizer_config.json` and (optionally) `chat_template.jinja`."""
        backend = _HFTokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = _read_json(folder / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text()
        gen = _read_json(folder / "generation_config.json")
        gen_eos = gen.get("eos_token_id")
        eos_ids = tuple(gen_eos) if isinstance(gen_eos, list) else ((gen_eos,) if isinstance(gen_eos, int) else ())
        return cls(
            backend,
            bos_token=_token_text(cfg.get("bos_token")),
            eos_token=_token_text(cfg.get("eos_token")),
            # Post-processors in tokenizer.json usually add BOS themselves; only honour an explicit flag.
            add_bos_token=bool(cfg.get("add_bos_token", False)) and backend.post_processor is None,
            chat_template=template,
            max_context=max_context,
            extra_special={"unk_token": _token_text(cfg.get("unk_token")), "pad_token": _token_text(cfg.get("pad_token"))},
            extra_eos_ids=eos_ids,
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with `add_special_tokens`, BOS (and EOS) are added when the model wants them."""
        ids: list[int] = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._add_bos and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        if add_special_tokens and self._add_eos and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids

    def encode_chat(self, rendered: str) -> list[int]:
        """Ids of a rendered chat prompt: BOS when the model wants one, unless the template already wrote it."""
        ids: list[int] = self._backend.encode(rendered, add_special_tokens=False).ids
        if self._add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._unused:
            ids = [i for i in ids if i not in self._unused]
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self) -> list[bytes]:
        """Every id's bytes as it adds them to decoded text, with special and unused tokens as b"" (never text).

        Byte-level vocabularies (GPT-2's alphabet) map back through it; SentencePiece ones spell a space `▁`
        and bytes `<0xHH>`."""
        backend = self._backend
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        byte_level = "ByteLevel" in json.dumps(json.loads(backend.to_str()).get("decoder"))
        to_byte = {c: b for b, c in byte_alphabet().items()}
        out = []
        for i in range(self.vocab_size):
            token = backend.id_to_token(i)
            if i in special or i in self._unused or token is None:
                out.append(b"")
            elif byte_level and all(c in to_byte for c in token):
                out.append(bytes(to_byte[c] for c in token))
            elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                out.append(bytes([int(token[3:5], 16)]))
            else:
                out.append(token.replace("\u2581", " ").encode())
        return out

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for a conversation; raises ChatTemplateError if the model has no template or refuses."""
        if self.chat_template is None:
            from backend.loading.chat_template import ChatTemplateError

            raise ChatTemplateError("this model has no chat template; use the completions endpoint")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text chunks, never splitting a UTF-8 character across chunks.

    Decodes a short window of recent ids (so word-leading spaces come out right) and holds text back while it
    ends in U+FFFD, the sign of a multi-byte character whose remaining bytes are still to come.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        # A few prompt tokens give the first generated token its context (a leading space, a merged byte).
        self._ids = list(prompt_ids[-6:])
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """Text made final by this token ("" while a character is incomplete)."""
        self._ids.append(token_id)
        prefix_text = self._tokenizer.decode(self._ids[self._prefix : self._read])
        text = self._tokenizer.decode(self._ids[self._prefix :])
        if len(text) <= len(prefix_text) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever is still held back (a character that never completed comes out as U+FFFD)."""
        prefix_text = self._tokenizer.decode(self._ids[self._prefix : self._read])
        text = self._tokenizer.decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text) :]


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json spells special tokens as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None
