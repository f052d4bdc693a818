"""What a stream owes the host until its next synchronize: the host memory its queued
transfers still read or write, and the errors its kernels reported through flags in device
memory. ``Backend`` owns one of each; a backend's hooks only enqueue and launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import OutOfBoundsError
from .ops import op_desc
from .tensor import Tensor

__all__ = ["HostKeepAlive", "KernelErrorFlags"]


class HostKeepAlive:
    """Host objects that queued work still reads or writes (a transfer's array, the event
    that pins it): held until the stream has passed them, so that Python never frees memory
    a DMA is using."""

    def __init__(self) -> None:
        self._held: list[Any] = []

    def hold(self, *objects: Any) -> None:
        """Keep ``objects`` (None ignored) alive until ``release``."""
        self._held.extend(o for o in objects if o is not None)

    def release(self) -> None:
        """The stream has finished everything queued: let go of it all."""
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)


class KernelErrorFlags:
    """Errors a kernel cannot raise (an index outside its tensor), reported through int32
    flags in device memory and raised at the stream's next synchronize, naming the op and the
    tensor.

    Each node whose kernel checks gets a slot of the backend's flag array when it is bound; a
    node of the same op and name bound again (a new plan of the same graph) gets the same slot.
    The backend passes the slot's address to the kernel, which sets it; ``launched()`` marks
    that the flags need reading; at synchronize the backend reads the array back (zeroing it)
    and calls ``raise_reported``. With more checked nodes than slots, slots are shared and the
    error names every node of a slot that was set.
    """

    N_SLOTS = 64

    def __init__(self, stream: str, n_slots: int = N_SLOTS) -> None:
        self.stream = stream
        self.n_slots = n_slots
        self.pending = False                  # a checking kernel ran since the last read
        self._slot_of: dict[str, int] = {}    # a node's description -> its slot
        self._described: list[list[str]] = [[] for _ in range(n_slots)]

    def slot(self, node: Tensor) -> int:
        """The flag slot of ``node``'s kernel (bind time)."""
        what = f"{op_desc(node)} {node.name or '<unnamed>'!r}"
        slot = self._slot_of.get(what)
        if slot is None:
            slot = len(self._slot_of) % self.n_slots
            self._slot_of[what] = slot
            self._described[slot].append(what)
        return slot

    def launched(self) -> None:
        """A kernel that may set its flag was queued (launch time)."""
        self.pending = True

    def raise_reported(self, flags: np.ndarray) -> None:
        """Raise ``OutOfBoundsError`` for the slots set in ``flags`` (one int32 per slot, read
        back after the stream finished); nothing when none is set."""
        self.pending = False
        culprits = [what for slot in np.flatnonzero(flags[:self.n_slots])
                    for what in self._described[int(slot)]]
        if culprits:
            raise OutOfBoundsError(
                f"{self.stream}: an index outside its tensor in {' or '.join(culprits)}: "
                f"rows a GET_ROWS or MUL_MAT_ID read there hold NaN, rows a SET_ROWS wrote "
                f"there were not written")
