"""`tidegate bench`: flags, and the run that ties workload, load profile, metrics and reports together."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from bench.client import Target
from bench.loadgen import LoadGenerator, LoadProfile, ProfileError
from bench.metrics import Slo, SloError, summarize
from bench.plan import PlanError, plan_capacity
from bench.progress import Progress
from bench.records import MeasuredRequest
from bench.report import format_summary, format_sweep, plot_sweep, read_summaries, write_csv, write_json
from bench.tokenizer import PromptTokenizer, TokenizerError, load_tokenizer
from bench.workloads import Workload, WorkloadError, WorkloadSpec


class UsageError(ValueError):
    """Flags that do not describe a run."""


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep wants comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("--sweep levels must be integers >= 1")
    return sorted(set(levels))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every bench flag on the `bench` subparser."""
    target = parser.add_argument_group("target")
    target.add_argument("--base-url", help="server root, e.g. http://127.0.0.1:9001 (no /v1)")
    target.add_argument("--model", help="model name to request")
    target.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="bearer token (default $OPENAI_API_KEY)")
    target.add_argument("--endpoint", default="/v1/completions",
                        choices=["/v1/completions", "/v1/chat/completions"])
    target.add_argument("--timeout", type=float, default=300.0, help="per-request deadline in seconds")
    target.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                        help="do not send ignore_eos (for servers that reject it)")

    load = parser.add_argument_group("load")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, help="closed loop: requests in flight (default 1)")
    mode.add_argument("--rate", type=float, help="open loop: mean requests per second")
    mode.add_argument("--sweep", type=_levels, help="closed-loop runs at each concurrency, e.g. 1,2,4,8")
    size = load.add_mutually_exclusive_group()
    size.add_argument("--num-requests", type=int, help="requests per run (default 100)")
    size.add_argument("--duration", type=float, help="seconds of sending per run")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape for --rate; 1 is Poisson")
    load.add_argument("--warmup", type=int, default=0, help="requests sent and discarded before measuring")
    load.add_argument("--max-connections", type=int, help="cap on the client's connection pool")
    load.add_argument("--seed", type=int, default=0)

    work = parser.add_argument_group("workload")
    work.add_argument("--input-len", type=int, default=256, help="prompt tokens")
    work.add_argument("--output-len", type=int, default=128, help="output tokens (max_tokens)")
    work.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in L x (1 +- r)")
    work.add_argument("--shared-prefix-len", type=int, default=0, help="tokens of a shared prefix")
    work.add_argument("--num-prefixes", type=int, default=1, help="distinct shared prefixes (or system prompts)")
    work.add_argument("--system-prompt-len", type=int, default=0,
                      help="tokens of a shared system prompt at the head of every turn of a conversation")
    work.add_argument("--multi-turn", type=int, default=1, metavar="TURNS", help="turns per conversation")
    work.add_argument("--dataset", type=Path, help="JSONL of {prompt|messages, output_len?}")
    work.add_argument("--workload", choices=["random", "grounded", "realistic"], default="random",
                      help="random words; grounded: edit or summarise a passage of a shipped text; realistic: "
                           "shipped chat turns and questions answered until EOS (--output-len is the cap)")
    work.add_argument("--tokenizer", type=Path, help="tokenizer.json, HF folder or .gguf (default SmolLM2)")

    out = parser.add_argument_group("results")
    out.add_argument("--slo", help="per-request SLOs in ms, e.g. ttft:500,tpot:50,e2el:5000")
    out.add_argument("--json", type=Path, help="write results as JSON")
    out.add_argument("--csv", type=Path, help="write one CSV row per run")
    out.add_argument("--png", type=Path, help="plot a sweep: P95 TTFT, P95 TPOT and throughput")
    out.add_argument("--save-requests", action="store_true", help="put per-request records in the JSON")
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line")

    plan = parser.add_argument_group("capacity plan")
    plan.add_argument("--plan", action="store_true", help="size a fleet from the sweep")
    plan.add_argument("--peak-qps", type=float, help="peak requests per second to serve")
    plan.add_argument("--headroom", type=float, default=1.0, help="multiplier over the peak, e.g. 1.3")
    plan.add_argument("--slo-attainment", type=float, default=0.95,
                      help="share of requests that must meet the SLO (default 0.95)")
    plan.add_argument("--from-json", type=Path,
                      help="re-read a saved run or sweep instead of sending requests (table, --csv, --png, --plan)")


def main(args: argparse.Namespace) -> int:
    """Run the benchmark (or re-read a saved one); returns the process exit code."""
    try:
        slo = Slo.parse(args.slo) if args.slo else None
        if args.plan and (slo is None or args.peak_qps is None):
            raise UsageError("--plan needs --slo and --peak-qps")
        if args.from_json is not None:
            if args.json is not None and args.json.resolve() == args.from_json.resolve():
                raise UsageError("--json would overwrite --from-json")
            # saved per-request records are re-judged against the new SLO; nothing is sent
            summaries = [_with_slo(s, slo) for s in read_summaries(args.from_json)]
            sweep = all(s.get("max_concurrency") is not None for s in summaries)
            print(format_sweep(summaries) if sweep else format_summary(summaries[0]))
        else:
            sweep = bool(args.sweep)
            summaries = _run(args, slo)
        if (args.png or args.plan) and not sweep:
            raise UsageError("--png and --plan need a sweep: give --sweep, or --from-json with a saved one")
    except (UsageError, SloError, ProfileError, WorkloadError, TokenizerError, PlanError, ValueError) as exc:
        print(f"tidegate bench: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tidegate bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ntidegate bench: interrupted; nothing written", file=sys.stderr)
        return 130
    status = 0 if any(s["completed"] for s in summaries) else 1
    data: dict[str, Any] = {"sweep": summaries} if sweep else summaries[0]
    if args.plan:
        try:
            plan = plan_capacity(summaries, args.peak_qps, args.headroom, args.slo_attainment)
            print(plan.describe())
            data["plan"] = plan.to_dict()
        except PlanError as exc:
            print(f"tidegate bench: {exc}", file=sys.stderr)
            status = 1
    if args.json:
        write_json(args.json, data)
    if args.csv:
        write_csv(args.csv, summaries)
    if args.png:
        first = summaries[0]
        lengths = f"{first.get('input_len')} in" if first.get("input_len") is not None else \
            f"{first.get('workload')} prompts"
        plot_sweep(args.png, summaries, f"{first.get('model', '')}: {lengths} / {first.get('output_len')} out")
    return status


def _run(args: argparse.Namespace, slo: Slo | None) -> list[dict[str, Any]]:
    if not args.base_url or not args.model:
        raise UsageError("--base-url and --model are required")
    if (args.plan or args.png) and not args.sweep:
        raise UsageError("--png and --plan need a sweep: give --sweep, or --from-json with a saved one")
    realistic = args.workload == "realistic"
    ignore_eos = args.ignore_eos and not realistic  # realistic answers end at EOS
    target = Target(args.base_url, args.model, args.api_key, args.endpoint, args.timeout, ignore_eos)
    spec = WorkloadSpec(args.input_len, args.output_len, args.range_ratio, args.shared_prefix_len,
                        args.num_prefixes, args.multi_turn, args.dataset, args.system_prompt_len,
                        args.workload == "grounded", realistic)
    num_requests = args.num_requests if args.num_requests is not None or args.duration is not None else 100
    levels: list[int | None] = list(args.sweep) if args.sweep else [
        None if args.rate is not None else (1 if args.concurrency is None else args.concurrency)]
    profiles = [LoadProfile(concurrency=level, rate=args.rate if level is None else None,
                            burstiness=args.burstiness, num_requests=num_requests, duration=args.duration,
                            warmup=args.warmup, seed=args.seed, max_connections=args.max_connections)
                for level in levels]
    tokenizer = _tokenizer(args)  # after every flag is checked: loading takes a second
    summaries = []
    for level_index, profile in enumerate(profiles):
        # fresh prompts at each level: repeating them would hit the server's prefix cache
        workload = Workload(spec, tokenizer, args.seed + level_index)
        label = f"c={profile.concurrency}" if profile.rate is None else f"rate={profile.rate:g}"
        progress = Progress(label, num_requests, args.duration) if args.progress else None
        result = asyncio.run(LoadGenerator(target, workload, profile, progress).run())
        summary = result.summary(slo) | {"base_url": args.base_url, "model": args.model,
                                          "endpoint": args.endpoint, "workload": args.workload,
                                          "ignore_eos": ignore_eos,
                                          # realistic prompts are as long as the set's text, not --input-len
                                          "input_len": None if realistic else args.input_len,
                                          "output_len": args.output_len}
        if args.save_requests:
            summary["requests"] = [r.to_dict() for r in result.records]
        if not args.sweep:
            print(format_summary(summary))
        _warn(label, summary)
        summaries.append(summary)
    if args.sweep:
        print(format_sweep(summaries))
    return summaries


def _warn(label: str, summary: dict[str, Any]) -> None:
    if not summary["generator_kept_up"]:
        print(f"tidegate bench: {label}: the load generator fell behind: sent {summary['achieved_rate']:.2f} "
              f"req/s of {summary['offered_rate']:.2f} req/s offered", file=sys.stderr)
    if summary["client_bound"]:
        print(f"tidegate bench: {label}: client-side queueing averaged {summary['mean_client_queue_ms']:.0f} ms "
              f"of {summary['mean_ttft_ms']:.0f} ms TTFT; the load generator may be the bottleneck",
              file=sys.stderr)


def _tokenizer(args: argparse.Namespace) -> PromptTokenizer | None:
    try:
        return load_tokenizer(args.tokenizer)
    except TokenizerError:
        if args.dataset is not None and args.tokenizer is None:
            return None  # a dataset runs without one; input tokens then come from the server's usage
        raise


def _with_slo(summary: dict[str, Any], slo: Slo | None) -> dict[str, Any]:
    """Re-judge saved per-request records against `slo` (the saved goodput used the run's own SLO)."""
    if slo is None or "requests" not in summary:
        return summary
    records = [MeasuredRequest.from_dict(r) for r in summary["requests"]]
    return summary | summarize(records, summary["duration"], slo)
