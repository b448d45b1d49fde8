"""Pausing Python's automatic garbage collection around work that allocates in bulk.

A generation-2 collection walks every object the process tracks (bar frozen ones), and the
collector starts one whenever the objects that survived younger collections grew by a
quarter: work that builds hundreds of thousands of objects at once (a burst of starts in a
service, a batch of 30,000 reports in the manager's state consumer) triggers one again and
again as it grows, each walking all it built so far. Such work makes little cyclic garbage
(reference counting frees the rest), so no collection runs while it does; what cycles it
left are collected once it is done, by the next automatic collection.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_collection() -> Iterator[None]:
    """No automatic collection inside; nests (the outermost one turns it back on)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
