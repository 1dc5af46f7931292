"""What autograd keeps alive for backward, measured with ``saved_tensors_hooks`` (chapters 01 and 06)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class SavedLog:
    """Tensors autograd saved for backward while the context was open: ``count`` every save, ``bytes``
    each distinct tensor once. A saved tensor is a reference, not a copy: ``held_bytes`` share memory with
    tensors the caller holds anyway (inputs, weights), ``extra_bytes`` are kept alive only for backward."""

    count: int = 0
    bytes: int = 0
    held_bytes: int = 0
    held_shapes: list[tuple[int, ...]] = field(default_factory=list)
    extra_shapes: list[tuple[int, ...]] = field(default_factory=list)
    _seen: set = field(default_factory=set, repr=False)
    _held: set = field(default_factory=set, repr=False)

    @property
    def extra_bytes(self) -> int:
        """Bytes of saved tensors that would have been freed without the backward pass."""
        return self.bytes - self.held_bytes

    def add(self, t: torch.Tensor) -> None:
        self.count += 1
        ptr = t.untyped_storage().data_ptr()
        key = (ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in self._seen:
            self._seen.add(key)
            size = t.numel() * t.element_size()
            self.bytes += size
            if ptr in self._held:
                self.held_bytes += size
                self.held_shapes.append(tuple(t.shape))
            else:
                self.extra_shapes.append(tuple(t.shape))


@contextmanager
def count_saved_tensors(held: Iterable[torch.Tensor] = ()) -> Iterator[SavedLog]:
    """Count the tensors autograd saves inside the ``with`` block: ``saved_tensors_hooks``' pack hook sees
    each one and returns it unchanged. A saved tensor sharing memory with one in `held` (itself, a view, a
    ``detach()``) counts in ``held_bytes``, the others in ``extra_bytes``."""
    log = SavedLog(_held={t.untyped_storage().data_ptr() for t in held})

    def pack(t: torch.Tensor) -> torch.Tensor:
        log.add(t)
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield log


def format_bytes(n: int) -> str:
    """``1536 -> '1.5 KiB'`` (binary units, one decimal)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
