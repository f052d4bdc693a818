"""How much of a mapping is in memory, for the tests of page dropping (Linux only)."""

from __future__ import annotations


def mapping_resident_bytes(address: int) -> int:
    """Rss of the mapping that starts at ``address`` (/proc/self/smaps)."""
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                current = int(head.split("-")[0], 16)
            elif head == "Rss:" and current == address:
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping at {address:#x}")
