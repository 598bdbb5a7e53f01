"""The token and batch limits of a repository: one record, one set of defaults, written into every model's config."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from toolkit.errors import RepositoryError


@dataclass(frozen=True)
class RepositoryLimits:
    max_batch_size: int = 64  # requests the engine runs at once
    max_input_len: int = 1536  # prompt tokens
    max_output_len: int = 1024  # tokens one request may generate
    max_seq_len: int = 2048  # prompt + output tokens
    max_num_tokens: int = 256  # tokens per engine step (prefill chunks + decodes)
    kv_cache_tokens: int = 32768  # paged KV pool, in tokens (the CPU engine's memory bound)
    kv_block_size: int = 64  # tokens per KV page
    max_queue_size: int = 256  # requests waiting for a batch slot; more are refused (0: no bound)

    def output_limit(self, prompt_tokens: int) -> int:
        """The most tokens a request with this prompt may ask for."""
        return max(0, min(self.max_output_len, self.max_seq_len - prompt_tokens))

    @property
    def kv_cache_blocks(self) -> int:
        return -(-self.kv_cache_tokens // self.kv_block_size)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "manifest") -> RepositoryLimits:
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: int(v) for k, v in data.items() if k in known})
        except (TypeError, ValueError) as exc:
            raise RepositoryError(
                f"the limits in the {where} are malformed: {data!r}", hint="rebuild the repository"
            ) from exc

    @classmethod
    def from_memory_plan(
        cls, plan, *, max_output_len: int | None = None, max_queue_size: int | None = None
    ) -> RepositoryLimits:
        """A GPU engine's limits, from the planner's numbers (toolkit.plan.memory.MemoryPlan)."""
        return cls(
            max_batch_size=plan.max_batch_size,
            max_input_len=plan.max_input_len,
            max_output_len=max_output_len or plan.max_seq_len - 1,
            max_seq_len=plan.max_seq_len,
            max_num_tokens=plan.max_num_tokens,
            # the pool the runtime serves with (an older plan without it: the planner's own)
            kv_cache_tokens=max(
                plan.runtime_kv_cache_tokens or plan.kv_cache_tokens, plan.max_seq_len
            ),
            kv_block_size=plan.tokens_per_block,
            max_queue_size=cls.max_queue_size if max_queue_size is None else max_queue_size,
        )

    def overridden(self, **values) -> RepositoryLimits:
        """These limits with the given values (None: keep) replaced."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})

    def check(self, max_position_embeddings: int) -> RepositoryLimits:
        """Refuse limits the engine cannot run, naming the flag and the fix."""
        for name, value in self.to_dict().items():
            if value <= 0 and name != "max_queue_size" or value < 0:
                raise RepositoryError(
                    f"--{name.replace('_', '-')}={value} must be positive",
                    hint="pass a positive number",
                )
        seq = self.max_seq_len
        # (broken, what is wrong, the fix), checked in order
        rules = (
            (
                seq > max_position_embeddings,
                f"--max-seq-len={seq} is over the model's max_position_embeddings "
                f"{max_position_embeddings}",
                f"pass --max-seq-len {max_position_embeddings} or less",
            ),
            (
                self.max_input_len >= seq,
                f"--max-input-len={self.max_input_len} leaves no room to generate within "
                f"--max-seq-len={seq}",
                "make --max-input-len smaller than --max-seq-len",
            ),
            (
                self.kv_cache_tokens < seq,
                f"--kv-cache-tokens={self.kv_cache_tokens} cannot hold one sequence of "
                f"--max-seq-len={seq}",
                f"pass --kv-cache-tokens {seq} or more",
            ),
        )
        for broken, message, hint in rules:
            if broken:
                raise RepositoryError(message, hint=hint)
        return self
