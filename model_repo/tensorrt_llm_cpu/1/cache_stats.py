"""What transformers' prefix cache reused, per request: the CPU engine reports it as the backend does.

transformers 5.24 reuses the KV blocks of prompt prefixes already computed (block sharing is on for
full-attention models: a new request's prompt is matched, block by block, against the hashes of the
blocks earlier requests completed), but records nothing of it. `search_prefix_match` is where the
scheduler matches a request's prompt and learns how many tokens it skips; wrapping it (once per process,
at class level, as scheduling.py patches the scheduler) records that count per request. A request
re-queued under KV pressure is matched again: only its first match counts.
"""

from __future__ import annotations

import threading

from transformers.generation.continuous_batching.cache import PagedAttentionCache

_PATCHED = "_toolkit_records_prefix_hits"


class PrefixHits:
    """Prompt tokens each request took from the prefix cache, and the blocks reused since the start."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._tokens: dict[str, int] = {}
        self._lock = threading.Lock()
        self.reused_blocks = 0  # cumulative, as TensorRT-LLM's KvCacheStats reusedBlocks

    def record(self, request_id: str, tokens: int) -> None:
        with self._lock:
            if request_id in self._tokens:
                return
            self._tokens[request_id] = tokens
            self.reused_blocks += tokens // self.block_size

    def pop(self, request_id: str) -> int:
        """The request's cached prompt tokens (0 if it matched none), forgotten."""
        with self._lock:
            return self._tokens.pop(request_id, 0)


def record_prefix_hits(hits: PrefixHits) -> None:
    """Send every prefix match of this process's caches to `hits` (one engine per Python-backend stub)."""
    if getattr(PagedAttentionCache, _PATCHED, None) is None:
        original = PagedAttentionCache.search_prefix_match

        def search_prefix_match(self, request_id, prompt_ids):
            matched = original(self, request_id, prompt_ids)
            getattr(PagedAttentionCache, _PATCHED).record(request_id, matched)
            return matched

        PagedAttentionCache.search_prefix_match = search_prefix_match
    setattr(PagedAttentionCache, _PATCHED, hits)
