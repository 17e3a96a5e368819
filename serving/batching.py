"""What every batcher in serving/ does before a step: wait for a first request, then a little for company."""
from __future__ import annotations

import time


def gather(cv, queue, max_batch: int, seconds: float, closed) -> bool:
    """With `cv` held: wait until `queue` holds a request, then up to `seconds` more while it holds fewer than
    `max_batch` (a batch of one decodes at nearly the cost of a full one). False when `closed()` with nothing queued."""
    while not queue and not closed():
        cv.wait()
    if not queue:
        return False
    deadline = time.monotonic() + seconds
    while len(queue) < max_batch and not closed():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        cv.wait(left)
    return True
