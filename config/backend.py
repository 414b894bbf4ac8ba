"""Backend (inference replica) settings: the one model that the CLI flags, the server and the engine share.

`tidegate backend` generates a flag for every scalar field here (`max_num_seqs` is `--max-num-seqs`; a switch
that is on by default is `--no-...`, without an `enable_` prefix), so a field's description is its flag's help.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, model_validator

from config.gateway import Tracing


class EngineSettings(BaseModel):
    """What the engine is built with; the engine takes these fields as they are."""

    model_config = ConfigDict(extra="forbid")

    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        default="auto", description="weights and activations dtype (auto: float32 on CPU, bfloat16 on GPU)")
    kv_cache_dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        default="auto", description="KV cache dtype (auto: float16 on CPU with float32 weights, else the weights' "
        "dtype); 16 bits hold twice the tokens of float32 in the same --kv-cache-memory")
    max_num_seqs: int = Field(default=64, ge=1, description="most requests in one step")
    max_num_batched_tokens: int = Field(default=1024, ge=16, description="token budget of one step")
    max_model_len: int | None = Field(default=None, ge=16, description="context window (default: the model's)")
    block_size: int = Field(default=16, ge=1, le=256, description="tokens per KV block")
    kv_cache_memory: ByteSize = Field(
        default=ByteSize(512 * 1024 * 1024), description="KV pool size, e.g. 512MiB")
    kv_cache_tokens: int | None = Field(
        default=None, ge=2, description="KV pool size in tokens instead of bytes (as llama.cpp's --ctx-size); "
        "overrides --kv-cache-memory")
    enable_prefix_caching: bool = Field(
        default=True, description="reuse the KV blocks of identical prompt prefixes")
    cuda_graphs: bool = Field(default=True, description="replay decode steps as captured CUDA graphs (on CUDA)")
    max_waiting: int = Field(default=256, ge=1, description="bound of the waiting queue")
    max_waiting_tokens: int = Field(
        default=262144, ge=1, description="bound of the waiting queue in prompt tokens")
    queue_timeout: float = Field(default=30.0, gt=0, description="seconds a request may wait to start")
    threads: int | None = Field(default=None, ge=1, description="torch CPU threads")
    quantization: Literal["auto", "none", "int8", "int4"] = Field(
        default="auto", description="weights kept quantized on CPU: auto (the GGUF file's Q4_0/Q4_1/Q8_0 "
        "blocks, their values kept exactly; decode steps round activations to 16 bits; float checkpoints stay "
        "float), int8 or int4 (float weights quantized at load), none (all float32)")
    speculative: Literal["none", "ngram", "draft"] = Field(
        default="ngram", description="speculative decoding: none, ngram (prompt lookup), or draft (a smaller "
        "model, --speculative-model)")
    speculative_model: str | None = Field(
        default=None, description="the draft model for --speculative draft (same tokenizer, smaller)")
    num_speculative_tokens: int = Field(
        default=6, ge=1, le=16, description="most draft tokens verified per sequence and step")
    grammar_compile_timeout: float = Field(
        default=10.0, gt=0, le=600, description="seconds a structured-output constraint may take to compile; past "
        "it the compile is killed and the request answered 400")

    @model_validator(mode="after")
    def _draft_needs_a_model(self) -> EngineSettings:
        if self.speculative == "draft" and not self.speculative_model:
            raise ValueError("--speculative draft needs --speculative-model PATH (a smaller model, same tokenizer)")
        return self


class BackendSettings(EngineSettings):
    """One replica: the engine's settings, plus the model to serve and the HTTP server's own."""

    model: str = Field(
        default="smollm2", description="path to a .gguf file or HF folder, or a named model (smollm2)")
    served_model_name: str | None = Field(
        default=None, description="the model's name in the API (default: the named model, else the file's stem)")
    cpu_wait: Literal["auto", "passive", "spin", "active"] = Field(
        default="auto", description="how torch's idle CPU workers wait between a step's ops: passive (sleep at "
        "once), spin (poll ~20,000 times, then sleep), active (always poll: fastest on cores given to the replica "
        "alone, several times slower on busy shared ones); auto: spin if every thread finds an idle CPU at start, "
        "else passive; OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment win over auto")
    host: str = "127.0.0.1"
    port: int = Field(default=9001, ge=0, le=65535)
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="largest request body accepted (413 beyond)")
    body_timeout: float = Field(default=30.0, gt=0, description="seconds to read a whole request body (408 beyond)")
    max_json_depth: int = Field(
        default=64, ge=2, description="deepest nesting of arrays and objects in a request body (400 beyond)")
    generation_config: str = Field(
        default="auto", description="sampling defaults for fields a request omits: auto (the model's own, then "
        "tidegate's measured table), none, or the path of a generation_config.json")
    override_generation_config: str | None = Field(
        default=None, description='JSON object of sampling defaults over those, e.g. \'{"temperature": 0}\'')
    drain_timeout: float = Field(
        default=5.0, gt=0, description="seconds SIGTERM waits for requests in flight before it cuts them")
    gateway_token_file: Path | None = Field(
        default=None, description="a file holding the token the gateway sends as its bearer (the channel's "
        "api_key): only requests with it may set cache_salt and priority; unset, any client may")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    tracing: Tracing = Field(
        default_factory=Tracing, description="spans per request; service name tidegate-backend")
