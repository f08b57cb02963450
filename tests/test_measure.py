"""``autoplan.runtime.measure``'s host memory: /proc/self/status read, its peak reset."""

from __future__ import annotations

import pytest

from autoplan.runtime.measure import HostMemory, host_memory, reset_host_peak
from hwprofiles.units import MiB


def test_anonymous_peak_leaves_out_the_file_pages_resident_at_the_reset():
    """Peak 300 MiB with 90 MiB of file pages and 2 of shared memory at the reset: 208 MiB of
    anonymous memory at most (the file pages grown to 100 MiB since make it 10 MiB more than the
    anonymous peak could have been, never less)."""
    reset = HostMemory(rss=250 * MiB, peak=250 * MiB, anon=158 * MiB, file=90 * MiB, shmem=2 * MiB)
    now = HostMemory(rss=260 * MiB, peak=300 * MiB, anon=158 * MiB, file=100 * MiB, shmem=2 * MiB)
    assert now.anon_peak_since(reset) == 208 * MiB


@pytest.mark.skipif(host_memory() is None, reason="no RssAnon/RssFile in /proc/self/status (not Linux >= 4.5)")
def test_reset_brings_the_peak_down_to_the_resident_set():
    block = bytearray(64 * MiB)  # touched: resident
    before = host_memory()
    assert before is not None and before.anon >= 64 * MiB and before.peak >= before.rss
    del block
    if not reset_host_peak():
        pytest.skip("/proc/self/clear_refs is not writable here")
    after = host_memory()
    assert after is not None and after.peak < before.peak - 32 * MiB  # the freed block's peak is gone
    assert after.peak >= after.rss - MiB
