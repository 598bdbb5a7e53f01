"""A fix to transformers' continuous-batching scheduler (5.24) that the CPU engine needs.

When the paged KV cache runs full, transformers offloads a running request back to the waiting
queue and sets `block_new_requests`, to schedule nothing new until a request *finishes* and frees
its blocks. Only a natural finish clears the flag. A request that is cancelled frees its blocks too
but leaves the flag set, so if the running requests all end by cancellation (a client going
away, a stop word, end_id under min_tokens: the engine cancels all of these), the scheduler never
schedules again and every request, the offloaded one included, waits forever without an error.

The patch clears the flag whenever cancellations removed requests, which is what a finish does.
"""

from __future__ import annotations

from transformers.generation.continuous_batching.scheduler import Scheduler

_PATCHED = "_toolkit_unblocks_after_cancellation"


def unblock_after_cancellation() -> None:
    """Patch Scheduler.clear_cancelled_requests (once per process)."""
    if getattr(Scheduler, _PATCHED, False):
        return
    original = Scheduler.clear_cancelled_requests

    def clear_cancelled_requests(self):
        states = original(self)
        if states:
            self.block_new_requests = False  # their blocks are free again, as after a finish
        return states

    Scheduler.clear_cancelled_requests = clear_cancelled_requests
    setattr(Scheduler, _PATCHED, True)
