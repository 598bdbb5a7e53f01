"""Each API key's share of the engine, so one client cannot hold up another.

The engine runs at most `max_batch_size` requests at once, within a KV pool of `kv_cache_tokens`: a
client that sends enough full-length streams takes every slot (or the whole pool), and everybody
else's request waits behind them, seconds for a 4-token answer became a minute. With more than one
API key, each key may hold at most all but one batch slot and all but one full-length sequence of the
KV pool (a request counts its prompt + max_tokens), so another key's request always finds room at
once; a request over its key's share waits here, in arrival order, until the key's own requests end.
One client alone loses one slot of throughput; nothing is bounded with one key or none (no one to be
fair to).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from toolkit.api.gate import CLIENT, SHARE_RELEASE
from toolkit.repository.limits import RepositoryLimits


class EngineShare:
    def __init__(self, limits: RepositoryLimits, clients: int, on_waiting=lambda n: None):
        self.enabled = clients > 1
        self.max_requests = max(1, limits.max_batch_size - 1)
        self.max_tokens = max(limits.max_seq_len, limits.kv_cache_tokens - limits.max_seq_len)
        self.requests: Counter = Counter()
        self.tokens: Counter = Counter()
        self.waiting = 0
        self.on_waiting = on_waiting  # told how many requests wait for their share (a gauge)
        self._freed: asyncio.Condition | None = None

    async def take(self, client: str, tokens: int, sequences: int = 1) -> Callable[[], None]:
        """Wait for `client`'s share to hold one more request of `sequences` engine sequences (n choices
        of each prompt) and `tokens` in all; returns its release (call once)."""
        if not self.enabled:
            return lambda: None
        freed = self._condition()
        async with freed:
            if not self._fits(client, tokens, sequences):
                self._count_waiting(+1)
                try:
                    await freed.wait_for(lambda: self._fits(client, tokens, sequences))
                finally:
                    self._count_waiting(-1)
            self.requests[client] += sequences
            self.tokens[client] += tokens
        return lambda: self._give_back(client, tokens, sequences)

    def _fits(self, client: str, tokens: int, sequences: int) -> bool:
        if not self.requests[client]:
            return True  # a key's first request always runs: its share holds at least one
        return (
            self.requests[client] + sequences <= self.max_requests
            and self.tokens[client] + tokens <= self.max_tokens
        )

    def _give_back(self, client: str, tokens: int, sequences: int) -> None:
        self.requests[client] -= sequences
        self.tokens[client] -= tokens
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        freed = self._condition()
        async with freed:
            freed.notify_all()

    def _count_waiting(self, change: int) -> None:
        self.waiting += change
        self.on_waiting(self.waiting)

    def _condition(self) -> asyncio.Condition:
        if self._freed is None:  # made on the serving loop (the app is built before it runs)
            self._freed = asyncio.Condition()
        return self._freed


async def hold_share(share: EngineShare, request, tokens: int, sequences: int = 1) -> None:
    """Take the request's share (waiting for it when its key holds all of its own); the gate gives it
    back when the response has ended."""
    state = request.scope.setdefault("state", {})
    state[SHARE_RELEASE] = await share.take(state.get(CLIENT, "key0"), tokens, sequences)
