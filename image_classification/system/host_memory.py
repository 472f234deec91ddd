"""glibc's allocator, set for a process that trains or evaluates on the CPU.

By default glibc hands an allocation above a threshold (128 KiB at first, then raised to the largest block
freed, up to 32 MiB) to the kernel as fresh pages, and returns free memory at the top of its heap once more
than twice that threshold lies there.  A training step on the CPU allocates and frees its activations,
tens to thousands of MB, every step, so each step takes its memory from the kernel again: tens of thousands
of page faults, each zeroing a page, and the TLB flushes of unmapping it.  :func:`keep_freed_memory` keeps
blocks up to glibc's largest threshold (32 MiB) in the heap and stops the heap from shrinking: the process
holds the most memory a step needed, as it would again at the next step.  Measured on the photo set's
ResNet-50 at 96 px, batch 32, two cores: 1-3% more training images/s (docs/performance.md, "The host
allocator on the CPU").

A process that sets any of glibc's ``MALLOC_*`` variables or a ``glibc.malloc.*`` tunable in
``GLIBC_TUNABLES``, or preloads another allocator (jemalloc, tcmalloc), keeps what it chose: this module then
changes nothing (mallopt would override the tunables).  Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import platform

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit machines (its dynamic threshold's ceiling)
NEVER_TRIM = -1  # glibc reads it as the largest size: the heap is never trimmed


def allocator_choice() -> str | None:
    """Why the allocator's settings are left alone (another allocator, the user's own settings, not glibc),
    or None where :func:`keep_freed_memory` may set them."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "not glibc"
    preloaded = os.environ.get("LD_PRELOAD", "")
    if any(name in preloaded for name in ("jemalloc", "tcmalloc", "mimalloc")):
        return "another allocator is preloaded"
    chosen = sorted(name for name in os.environ if name.startswith("MALLOC_"))
    chosen += malloc_tunables(os.environ.get("GLIBC_TUNABLES", ""))
    if chosen:
        return f"{', '.join(chosen)} set"
    return None


def malloc_tunables(tunables: str) -> list[str]:
    """The allocator's tunables that a ``GLIBC_TUNABLES`` value sets (``name=value`` pairs joined by colons;
    glibc's own ``glibc.malloc.*``), in the order given; the other tunables (``glibc.cpu.*``...) say nothing
    of the allocator."""
    names = (pair.split("=", 1)[0].strip() for pair in tunables.split(":"))
    return [name for name in names if name.startswith("glibc.malloc.")]


def keep_freed_memory() -> bool:
    """Keep freed blocks of up to 32 MiB in the heap and never shrink it (see the module's docstring);
    whether the settings were made.  Process-wide and for the rest of the process; loader workers forked
    after it inherit it."""
    if allocator_choice() is not None:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # glibc's mallopt answers 1 where it took the value
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
