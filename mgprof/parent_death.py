"""A child process that ends when its parent does, however the parent ends (Linux).

mgprof starts long-lived children (torchrun and its workers, TensorBoard) and must not leave
them running when it is killed with SIGKILL, which it cannot catch: the kernel's
``PR_SET_PDEATHSIG`` sends the child a signal when its parent thread exits.
"""

from __future__ import annotations

import sys

PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int) -> bool:
    """Have the kernel send ``sig`` to this process when its parent ends (Linux only).

    False where that cannot be arranged; the parent's own signal forwarding still applies.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
