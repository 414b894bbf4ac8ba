"""Per-request sampling parameters, validated once when built."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_STOP_STRINGS = 16
MAX_STOP_LEN = 256
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows
MAX_TOP_LOGPROBS = 20


@dataclass(slots=True)
class SamplingParams:
    """How one request samples and when it stops.

    temperature 0 means greedy; top_k 0 means off; stop strings are trimmed from the output text.
    Penalties follow OpenAI (presence, frequency: subtracted, over the output tokens) and transformers
    (repetition: logits divided or multiplied, over prompt and output tokens). `logprobs` is how many
    alternatives to report per token (0: only the chosen one), None for no logprobs.
    Construction raises ValueError with a message naming the bad field.
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether the sampler must track this request's token counts."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self) -> None:
        """Raise ValueError if any field is out of range (also callable after mutation)."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be between 0 and max_tokens, got {self.min_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be between 0 and 100, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not 0 < len(s) <= MAX_STOP_LEN:
                raise ValueError(f"each stop string must be 1..{MAX_STOP_LEN} characters, got {s!r}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative integers, got {t!r}")
        self._validate_penalties()

    def _validate_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be between -2 and 2, got {getattr(self, name)!r}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty!r}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens, got {len(self.logit_bias)}")
        for token, bias in self.logit_bias.items():
            if not isinstance(token, int) or token < 0 or not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias maps token ids to numbers in [-100, 100], got {token!r}: {bias!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs!r}")
