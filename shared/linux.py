"""Child processes that must not outlive their parent (process-isolated observers, the
manager's state process), and what a process's resident memory is (Linux ``/proc``)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL from the kernel when the parent dies, even while this process is too busy to
    notice. Linux-only; it follows the parent *thread* that spawned us, so spawn children
    from the event-loop thread, never from a worker thread."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def statm_resident_bytes(statm: bytes) -> int:
    """Resident bytes from the text of a ``/proc/<pid>/statm``; ``ValueError`` or
    ``IndexError`` if it is not one (a process exiting)."""
    return int(statm.split()[1]) * PAGE_SIZE
