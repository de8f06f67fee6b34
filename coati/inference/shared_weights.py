"""The policy's weights in memory that vLLM servers map, instead of a file per update.

One anonymous memory file (`memfd_create`): it has no name in `/dev/shm`, a server gets it as a file descriptor over
its connection (`send_handle`), and its memory is freed when the last process holding it exits, however it exits
(SIGKILL of the whole process tree included). It holds two slots of the state dict's size: version v is written to
slot v % 2, so a publish writes one slot while a server may still be loading the other. A slot is written again only
once every load of the version it held has finished (`reuse_after`), so a server never loads half of a newer version.
The layout (each tensor's name, dtype, shape and byte offset in a slot) is fixed by the first state dict.
"""
import contextlib
import mmap
import os
import threading
from concurrent.futures import Future, wait
from typing import Dict, Iterator, List, Optional, Tuple

import torch

ALIGN = 64
"""Byte alignment of each tensor in a slot (any dtype's view of it is aligned)."""

Layout = List[Tuple[str, str, List[int], int]]
"""(name, dtype name as `torch` spells it, shape, byte offset in the slot) per tensor, in state-dict order."""


def layout_of(state_dict: Dict[str, torch.Tensor]) -> Tuple[Layout, int]:
    """Where each tensor of `state_dict` goes in a slot, and the slot's size in bytes."""
    layout, offset = [], 0
    for name, tensor in state_dict.items():
        layout.append((name, str(tensor.dtype).replace("torch.", ""), list(tensor.shape), offset))
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return layout, max(offset, ALIGN)


class SharedWeights:
    """Two slots of `state_dict`'s layout in one memory file. `write` copies a state dict into a slot and marks it the
    newest; a slot is written again only once the loads of what it held (`reuse_after`) and every `newest()` reader of
    it are done."""

    def __init__(self, state_dict: Dict[str, torch.Tensor]) -> None:
        self.layout, self.slot_bytes = layout_of(state_dict)
        self.fd = os.memfd_create("coati-weights", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, 2 * self.slot_bytes)
        self._map = mmap.mmap(self.fd, 2 * self.slot_bytes)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._loads: List[Optional[Future]] = [None, None]   # the queued loads of the version each slot holds
        self._readers = [0, 0]
        self._newest: Optional[Tuple[int, int]] = None      # (slot, version) last written
        self._changed = threading.Condition()

    @property
    def size(self) -> int:
        return 2 * self.slot_bytes

    def fits(self, state_dict: Dict[str, torch.Tensor]) -> bool:
        return layout_of(state_dict)[0] == self.layout

    def write(self, state_dict: Dict[str, torch.Tensor], version: int) -> int:
        """Copy `state_dict` (of this layout) into slot `version % 2` once nobody needs what it held; returns the slot."""
        slot = version % 2
        if self._loads[slot] is not None:
            wait([self._loads[slot]])
        with self._changed:
            self._changed.wait_for(lambda: self._readers[slot] == 0)
        base = slot * self.slot_bytes
        with torch.no_grad():
            for name, _, shape, offset in self.layout:
                tensor = state_dict[name].detach()
                start = base + offset
                target = self._bytes[start:start + tensor.numel() * tensor.element_size()]
                target.view(tensor.dtype).view(shape).copy_(tensor)
        with self._changed:
            self._newest = (slot, version)
        return slot

    def reuse_after(self, slot: int, loads: Future) -> None:
        """`slot` may be written again once `loads` (every server's load of it) is done."""
        self._loads[slot] = loads

    @contextlib.contextmanager
    def newest(self) -> Iterator[Optional[Tuple[int, int]]]:
        """The newest (slot, version), kept from being overwritten while the block reads it (None before any write)."""
        with self._changed:
            held = self._newest
            if held is not None:
                self._readers[held[0]] += 1
        try:
            yield held
        finally:
            if held is not None:
                with self._changed:
                    self._readers[held[0]] -= 1
                    self._changed.notify_all()

    def close(self) -> None:
        del self._bytes
        self._map.close()
        os.close(self.fd)
