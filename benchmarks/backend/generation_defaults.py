"""Which sampling defaults answer the default model's factual questions correctly most often.

    PYTHONPATH=. .venv/bin/python -m benchmarks.backend.generation_defaults --seeds 5

Runs every question of bench/data/factual_questions.jsonl through the chat template and the real engine at
each setting (none hotter than the model authors' temperature 0.2 / top_p 0.9), `--seeds` times for the sampled
ones, and counts an answer correct when one of the question's answers appears in it as a whole word. Prints a
Markdown table, best first; the winner goes into backend/loading/generation_defaults.json.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import torch

from backend.engine.core import Engine, EngineConfig
from backend.engine.sampling_params import SamplingParams
from backend.loading.model_cache import pull

QUESTIONS = Path(__file__).parents[2] / "bench" / "data" / "factual_questions.jsonl"
SETTINGS: list[dict[str, Any]] = [
    {"temperature": 0.0},
    {"temperature": 0.1, "top_p": 0.9},
    {"temperature": 0.1, "top_p": 0.9, "top_k": 20},
    {"temperature": 0.2, "top_p": 0.9},
    {"temperature": 0.2, "top_p": 0.9, "top_k": 20},
    {"temperature": 0.2, "top_p": 0.9, "top_k": 40},
]


def load_questions(path: Path = QUESTIONS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def is_correct(text: str, answers: list[str]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(a)}(?!\w)", text, re.IGNORECASE) for a in answers)


def measure(engine: Engine, questions: list[dict[str, Any]], setting: dict[str, Any], seeds: int,
            max_tokens: int) -> tuple[int, int, int]:
    """(correct, asked, of which the first question's correct answers) over every question, `seeds` times for
    a sampled setting, once for greedy. The first question is `tidegate up`'s printed example."""
    tok = engine.tokenizer
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q["question"]}]),
                          add_special_tokens=False) for q in questions]
    runs = 1 if setting.get("temperature", 1.0) == 0.0 else seeds
    all_prompts, params, answers = [], [], []
    for run in range(runs):
        for i, (prompt, q) in enumerate(zip(prompts, questions, strict=True)):
            all_prompts.append(prompt)
            params.append(SamplingParams(max_tokens=max_tokens, seed=run * 1000 + i, **setting))
            answers.append(q["answers"])
    results = engine.generate_offline(all_prompts, params)
    right = [is_correct(r.text, a) for r, a in zip(results, answers, strict=True)]
    return sum(right), len(right), sum(right[::len(questions)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", type=int, nargs="*", help="indices into SETTINGS to run (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine(EngineConfig(pull("smollm2"), max_num_seqs=128, max_num_batched_tokens=4096))
    questions = load_questions()
    rows = []
    for setting in [SETTINGS[i] for i in args.only] if args.only else SETTINGS:
        started = time.perf_counter()
        correct, asked, first = measure(engine, questions, setting, args.seeds, args.max_tokens)
        runs = asked // len(questions)
        rows.append((correct / asked, setting, correct, asked, f"{first}/{runs}"))
        print(f"{setting}: {correct}/{asked}, first question {first}/{runs}, "
              f"in {time.perf_counter() - started:.0f}s", flush=True)
    print(f"\n| setting | correct | accuracy | {questions[0]['question']} |\n| --- | --- | --- | --- |")
    for accuracy, setting, correct, asked, first_right in sorted(rows, key=lambda r: -r[0]):
        print(f"| `{json.dumps(setting)}` | {correct}/{asked} | {accuracy:.1%} | {first_right} |")


if __name__ == "__main__":
    main()
