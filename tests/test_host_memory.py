"""The CPU program's step-end release of freed host memory (autoplan.runtime.host_memory):
memory freed inside the heap, which free() keeps, goes back to the system."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from autoplan.runtime.host_memory import _malloc_trim

# 200 blocks of 256 KiB from the heap (the mmap threshold set above them), the heap's top held
# by one more, all 200 freed: free() keeps their 50 MiB; the release returns it.
RETAINED = textwrap.dedent(
    """
    import ctypes, ctypes.util
    from autoplan.runtime.host_memory import release_free_memory
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    libc.mallopt(-3, 1 << 22)  # M_MMAP_THRESHOLD: blocks under 4 MiB come from the heap
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
    blocks = [libc.malloc(256 << 10) for _ in range(201)]
    for b in blocks:
        ctypes.memset(b, 1, 256 << 10)
    for b in blocks[:-1]:
        libc.free(b)
    before = rss()
    release_free_memory()
    print((before - rss()) / 2**20)
    """
)


@pytest.mark.skipif(_malloc_trim() is None or sys.platform != "linux", reason="needs glibc's malloc_trim")
def test_release_returns_memory_free_kept_in_the_heap():
    out = subprocess.run([sys.executable, "-c", RETAINED], capture_output=True, text=True, check=True)
    released_mib = float(out.stdout)
    assert released_mib > 40  # of the 50 MiB freed
