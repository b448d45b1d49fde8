"""The broker's memory as the broker counts it, with every process's garbage collected first.

The RSS of the broker's VM is a poor measure of what held starts cost it: the VM keeps freed
memory in its allocators, and each Erlang process collects its garbage on its own schedule,
so the difference of two RSS samples moved with whatever ran before (the cost curve once
plotted -22 KiB per observer at 10,000 emitting: a baseline that moved, not a broker that
shrank). Here every process is collected, then ``erlang:memory(total)`` is read: the live
data of processes, ETS tables (the message store's index), binaries and code. What held
starts add to it is theirs.
"""

from __future__ import annotations

from tools import infra

_MEASURE = "lists:foreach(fun erlang:garbage_collect/1, erlang:processes()), erlang:memory(total)."


def broker_memory_kib(node: infra.RabbitNode) -> int:
    """The node's live memory in KiB, after a garbage collection of every process."""
    return int(node.ctl("eval", _MEASURE, timeout=300).strip()) // 1024
