"""Child processes that must not outlive their parent (process-isolated observers, the
manager's state process)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL from the kernel when the parent dies, even while this process is too busy to
    notice. Linux-only; it follows the parent *thread* that spawned us, so spawn children
    from the event-loop thread, never from a worker thread."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
