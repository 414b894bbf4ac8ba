"""The engine: a step loop in its own thread, bridged to asyncio callers and to offline batch jobs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import cast

import torch

from backend.engine import host
from backend.engine.block_pool import BlockPool
from backend.engine.choices import request_sequences
from backend.engine.engine_config import EngineConfig
from backend.engine.errors import EngineOverloaded, InvalidGenerateRequest, QueueTimeout
from backend.engine.output import delta, finish_reason, step_output
from backend.engine.records import Completion, Delta, EngineStats, GenerateRequest, TokenLogprobs
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import Scheduler
from backend.engine.sequence import FinishReason, Sequence, SequenceStatus
from backend.engine.spec.speculation import Speculator
from backend.engine.structured_output import GrammarCompiler
from backend.engine.validation import validate_request
from backend.executor.runner import ModelRunner
from backend.executor.sample.verification import DraftVerifier
from backend.loading.loader import LoadedModel, load_model

log = logging.getLogger(__name__)


class Engine:
    """Serves many concurrent requests from one model with continuous batching over a paged KV cache."""

    def __init__(self, config: EngineConfig, *, loaded: LoadedModel | None = None) -> None:
        """Load the model (or reuse `loaded`, already on config.device in config's dtype) and size the cache."""
        if config.threads:
            torch.set_num_threads(config.threads)
        host.keep_freed_memory(arenas=torch.get_num_threads())
        self.config = config
        dtype = config.torch_dtype()
        if loaded is None:
            with host.collector_paused():
                loaded = host.in_passing_thread(lambda: load_model(
                    Path(config.model_path), device=config.device, dtype=dtype, quantization=config.quantization))
            host.release_freed_memory()
        self.tokenizer = loaded.tokenizer
        self.model_config = loaded.config
        kv_dtype = config.kv_torch_dtype()
        num_blocks = config.kv_blocks(loaded.config)
        self.max_model_len = min(
            config.max_model_len or loaded.config.max_position_embeddings,
            loaded.config.max_position_embeddings,
            num_blocks * config.block_size,
        )
        self.pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.pool,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_waiting=config.max_waiting,
            max_waiting_tokens=config.max_waiting_tokens,
            queue_timeout=config.queue_timeout,
        )
        model = loaded.model
        self.runner = host.in_passing_thread(
            lambda: ModelRunner(
                model, num_blocks, config.block_size, device=config.device, dtype=kv_dtype,
                cuda_graph_batch=config.max_num_seqs if config.cuda_graphs else 0,
                max_blocks_per_seq=-(-self.max_model_len // config.block_size),
            )
        )
        self.sampler = DraftVerifier(self.tokenizer.eos_token_ids)
        self.speculator = Speculator.build(config, self.pool, loaded.config, dtype, kv_dtype)
        self.grammars = GrammarCompiler(self.tokenizer, timeout=config.grammar_compile_timeout)
        self._eos = frozenset(self.tokenizer.eos_token_ids)
        self._lock = threading.Condition()  # guards the scheduler, the pool, _seqs and _outputs
        # Held while outputs are detokenized and delivered, outside _lock; taken before _lock, never after.
        self._output_lock = threading.Lock()
        # tokens sampled but not yet turned into deltas: each sequence's tokens of one step together
        self._outputs: list[tuple[Sequence, list[int], list[TokenLogprobs | None]]] = []
        self._seqs: dict[str, list[Sequence]] = {}  # each request's choices
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._steps = 0

    # -- public API -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Run the step loop in a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tidegate-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """Stop the step loop; running requests end with finish_reason "abort"."""

        def stop() -> None:
            self._stopping = True
            self._abort_all_locked()
            self._lock.notify_all()

        self._process_outputs(then=stop)
        self.grammars.close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Delta]:
        """Stream a request's deltas. Raises InvalidGenerateRequest or EngineOverloaded before it is queued, and
        QueueTimeout if it cannot start in time. Closing the iterator early aborts the request."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | QueueTimeout] = asyncio.Queue()

        def sink(item: Delta | QueueTimeout) -> None:
            # The caller's loop may be gone; the request is then aborted by the finally below.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, item)

        self._submit(request, sink, bounded=True)
        done = False
        unfinished = request.n
        try:
            while True:
                item = await queue.get()
                if isinstance(item, QueueTimeout):
                    done = True
                    raise item
                if item.finish_reason is not None:
                    unfinished -= 1
                    done = unfinished == 0
                yield item
                if done:
                    return
        finally:
            if not done:
                self.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        """End a request now (waiting or running) and free its blocks; unknown ids are ignored."""
        self._process_outputs(then=lambda: self._abort_locked(request_id))

    def generate_offline(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Completion]:
        """Run a batch job to completion (in the step thread if started, else in the caller's thread)."""
        all_params = params if isinstance(params, list) else [params] * len(prompts)
        if len(all_params) != len(prompts):
            raise InvalidGenerateRequest(f"{len(prompts)} prompts but {len(all_params)} sampling params")
        deltas: list[list[Delta]] = [[] for _ in prompts]
        remaining = [len(prompts)]
        all_done = threading.Event()

        def collector(index: int) -> Callable[[Delta | QueueTimeout], None]:
            def sink(item: Delta | QueueTimeout) -> None:
                assert isinstance(item, Delta)  # offline requests have no queue deadline
                deltas[index].append(item)
                if item.finish_reason is not None:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        all_done.set()

            return sink

        tag = f"offline-{id(deltas)}"
        requests = [
            GenerateRequest(f"{tag}-{i}", prompt, sp)
            for i, (prompt, sp) in enumerate(zip(prompts, all_params, strict=True))
        ]
        for request in requests:  # all or nothing: refuse the job before any of it runs
            self._validate(request)
        for i, request in enumerate(requests):
            self._submit(request, collector(i), bounded=False)
        if not prompts:
            return []
        try:
            if self._thread is not None:
                all_done.wait()
            else:
                while not all_done.is_set():
                    self.step()
        except BaseException:  # interrupted or a failed step: do not leave the batch holding blocks
            for i in range(len(prompts)):
                self.abort(f"{tag}-{i}")
            raise
        return [Completion.from_deltas(ds) for ds in deltas]

    def stats(self) -> EngineStats:
        with self._lock:
            total, free = self.pool.num_blocks, self.pool.num_free
            spec = self.speculator.stats
            return EngineStats(
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting),
                kv_blocks_total=total,
                kv_blocks_free=free,
                kv_usage=1.0 - free / total,
                prefix_cache_queries=self.pool.prefix_queries,
                prefix_cache_hits=self.pool.prefix_hits,
                num_preemptions=self.scheduler.num_preemptions,
                steps=self._steps,
                spec_draft_tokens=spec.num_draft_tokens,
                spec_accepted_tokens=spec.num_accepted_tokens,
                spec_emitted_tokens=spec.num_emitted_tokens,
            )

    def step(self) -> bool:
        """Schedule, run and sample one step, then deliver its deltas; False if there was nothing to run.

        Under the lock the step only appends the sampled ids and ends sequences by stop token or length;
        detokenizing, stop strings and delivery follow outside it, before the next step is scheduled."""
        with self._lock:
            for seq in self.scheduler.expire(time.monotonic()):
                self._seqs.pop(seq.request_id, None)
                if seq.sink is not None:
                    seq.sink(QueueTimeout("request could not start within the queue timeout", self.scheduler.retry_after()))
            drafting = self.speculator.propose(self.scheduler.running)
        self.speculator.run_draft_model(drafting)
        with self._lock:
            batch = self.scheduler.schedule()
        if not batch:
            return False
        with torch.inference_mode():
            logits, sampled = self.runner.run(batch)
            sampled_out = self.sampler(logits, sampled)
        sampling = cast("list[Sequence]", sampled)  # the runner hands back the batch's own sequences
        now = time.monotonic()
        with self._lock:
            self.speculator.exclude_drafts(batch.seqs, batch.num_new_tokens)
            self.scheduler.advance(batch)
            for seq in sampling:  # a first choice whose prompt is now computed starts the request's others
                if seq.forks:
                    self.scheduler.fork(seq)
            for seq, token_ids, logprobs in zip(sampling, sampled_out.token_ids, sampled_out.logprobs, strict=True):
                if seq.status is SequenceStatus.RUNNING:  # not aborted while the step ran
                    self._append(seq, token_ids, logprobs, now)
                if seq.draft_token_ids:
                    self.speculator.settle(seq, len(token_ids))
            self._steps += 1
        self._process_outputs()
        return True

    # -- internals ------------------------------------------------------------------------------------

    def _submit(self, request: GenerateRequest, sink: Callable, *, bounded: bool) -> None:
        self._validate(request)
        seqs = request_sequences(request, self.tokenizer)
        for seq in seqs:
            seq.sink = sink
        with self._lock:
            if self._stopping:
                raise EngineOverloaded("engine is shutting down", retry_after=1.0)
            if request.request_id in self._seqs:
                raise InvalidGenerateRequest(f"request_id {request.request_id!r} is already in flight")
            self.scheduler.add(seqs[0], bounded=bounded)
            self._seqs[request.request_id] = seqs
            self._lock.notify_all()

    def _validate(self, request: GenerateRequest) -> None:
        validate_request(request, self.model_config.vocab_size, self.max_model_len)

    def _append(self, seq: Sequence, token_ids: list[int], logprobs: list[TokenLogprobs | None],
                now: float) -> None:
        """Append a step's tokens to a sequence, up to the first one that ends it."""
        if seq.timings.first_token is None:
            seq.timings.first_token = now
        for count, token_id in enumerate(token_ids, 1):
            seq.token_ids.append(token_id)
            seq.timings.token_times.append(now)
            reason = finish_reason(seq, token_id, self._eos)
            constraint = seq.constraint
            if constraint is not None and (not constraint.accept(token_id) or constraint.is_terminated):
                reason = FinishReason.STOP  # the grammar is complete (a refused token cannot pass the mask)
            if reason is not None:
                self._finish_locked(seq, reason)
                token_ids, logprobs = token_ids[:count], logprobs[:count]
                break
        self._outputs.append((seq, token_ids, logprobs))

    def _process_outputs(self, then: Callable[[], None] | None = None) -> None:
        """Turn the sampled tokens into deltas outside the engine lock; once none are left, run `then` under
        the lock, so that an abort's final delta always follows the deltas of the steps before it."""
        with self._output_lock:
            while True:
                with self._lock:
                    outputs, self._outputs = self._outputs, []
                    if not outputs:
                        if then is not None:
                            then()
                        return
                for seq, token_ids, logprobs in outputs:
                    text, kept, shown = step_output(seq, token_ids, logprobs)
                    if kept is not None:  # a stop string ended the output at token number `kept`
                        with self._lock:
                            self._finish_locked(seq, FinishReason.STOP)
                            del seq.token_ids[seq.num_tokens - len(token_ids) + kept :]
                        token_ids = token_ids[:kept]
                    self._deliver(seq, text, token_ids, shown)

    def _finish_locked(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.is_finished:  # the token that reached max_tokens completed a stop string: "stop" wins
            seq.finish_reason = reason
            return
        self.scheduler.finish(seq, reason)
        choices = self._seqs.get(seq.request_id, [])
        if all(choice.is_finished for choice in choices):
            self._seqs.pop(seq.request_id, None)

    def _abort_locked(self, request_id: str) -> None:
        for seq in self._seqs.pop(request_id, []):
            if not seq.is_finished:
                self.scheduler.finish(seq, FinishReason.ABORT)
                self._deliver(seq, "", [])

    def _abort_all_locked(self) -> None:
        for request_id in list(self._seqs):
            self._abort_locked(request_id)

    def _deliver(self, seq: Sequence, text: str, token_ids: list[int],
                 logprobs: list[TokenLogprobs] | None = None) -> None:
        if seq.sink is not None:
            seq.sink(delta(seq, text, token_ids, logprobs or []))

    def _loop(self) -> None:
        released = time.monotonic()
        while True:
            with self._lock:
                idle = not self._lock.wait_for(lambda: self._stopping or self.scheduler.has_work, host.IDLE_RELEASE_S)
            # once per quiet spell, or every few busy seconds: the kept activations re-fault once, not every step
            if idle or time.monotonic() - released > host.BUSY_RELEASE_S:
                host.release_freed_memory()
                released = time.monotonic()
            with self._lock:
                while not self._stopping and not self.scheduler.has_work:
                    self._lock.wait()
                if self._stopping:
                    return
            try:
                if not self.step():
                    time.sleep(0.005)  # waiting requests that cannot start yet: poll, do not spin
            except Exception:  # a failed step must not kill the loop: end what was in flight
                log.exception("engine step failed; aborting in-flight requests")
                self._process_outputs(then=self._abort_all_locked)

