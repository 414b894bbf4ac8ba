"""The shipped set behind `--workload realistic`: real chat turns, factual questions, and tasks over the
paragraphs of a public-domain text, as conversations of user turns (the server's own answers fill the
assistant turns between them at run time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA = Path(__file__).parent / "data"
CHAT_TURNS = DATA / "chat_turns.jsonl"  # written for this project
QUESTIONS = DATA / "factual_questions.jsonl"
PASSAGES = DATA / "alice_chapter1.txt"  # Lewis Carroll, 1865: public domain
PASSAGE_TASKS = (
    "Summarise this passage in two or three sentences.",
    "What happens in this passage, and how does Alice feel about it?",
    "List the things Alice sees or does in this passage.",
    "Explain any old-fashioned words or phrases in this passage.",
)


@dataclass(frozen=True, slots=True)
class RealConversation:
    """User turns in order, with the system prompt sent ahead of each, if any."""

    turns: tuple[str, ...]
    system: str | None = None


@cache
def realistic_set() -> tuple[RealConversation, ...]:
    """Every conversation of the set: chats, then questions, then each task over each paragraph."""
    chats = []
    for line in CHAT_TURNS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            chats.append(RealConversation(tuple(row["turns"]), row.get("system")))
    questions = [RealConversation((json.loads(line)["question"],))
                 for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    paragraphs = [p.strip() for p in PASSAGES.read_text(encoding="utf-8").splitlines() if len(p.split()) >= 30]
    tasks = [RealConversation((f"{task}\n\n{paragraph}",)) for paragraph in paragraphs for task in PASSAGE_TASKS]
    return (*chats, *questions, *tasks)


def transcript(messages: list[dict[str, str]]) -> str:
    """A conversation as a plain prompt for /v1/completions, ending where the assistant's answer starts."""
    labels = {"system": "", "user": "User: ", "assistant": "Assistant: "}
    lines = [labels.get(m["role"], "") + m["content"] for m in messages]
    return "\n\n".join(lines) + "\n\nAssistant:"
