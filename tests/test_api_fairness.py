"""Each API key's share of the engine counts engine sequences, not HTTP requests: n choices and a list of
prompts are each a sequence in the batch. (Before, a request of 64 prompts x n=8 counted as one, and a
chat request's n choices held the tokens of one: a key could fill the engine past its share.)"""

from __future__ import annotations

import asyncio

from toolkit.api.fairness import EngineShare
from toolkit.repository.limits import RepositoryLimits

LIMITS = RepositoryLimits(max_batch_size=8, max_seq_len=256, kv_cache_tokens=4096)


async def _second_waits(first_sequences: int, second_sequences: int) -> bool:
    share = EngineShare(LIMITS, clients=2)
    await share.take("key0", 100, first_sequences)
    try:
        await asyncio.wait_for(share.take("key0", 100, second_sequences), 0.2)
    except TimeoutError:
        return True
    return False


def test_a_request_of_many_sequences_takes_that_many_batch_slots_of_its_key():
    assert asyncio.run(_second_waits(7, 1))  # 7 of the key's 7 slots held: the next one waits
    assert not asyncio.run(_second_waits(6, 1))  # one slot left: it runs


def test_another_key_still_runs_beside_a_key_that_holds_its_whole_share():
    async def run() -> bool:
        share = EngineShare(LIMITS, clients=2)
        await share.take("key0", 100, 7)
        release = await asyncio.wait_for(share.take("key1", 100, 1), 0.2)
        release()
        return True

    assert asyncio.run(run())
