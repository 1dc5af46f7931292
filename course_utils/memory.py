"""What autograd keeps alive for backward, measured with ``saved_tensors_hooks`` (chapters 01 and 06)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class SavedLog:
    """Tensors that autograd saved for backward while the context was open.

    ``count`` counts every save; ``bytes`` counts each distinct tensor once (two ops that save
    the same tensor keep one copy alive). Autograd saves a *reference*, not a copy, so a saved
    tensor costs memory only if nothing else keeps it alive. ``held_bytes`` is the part that
    shares memory with a tensor the caller said it holds anyway (the input batch, the weights);
    ``extra_bytes`` is the rest: intermediate results kept alive only for the backward pass.
    """

    count: int = 0
    bytes: int = 0
    held_bytes: int = 0
    shapes: list[tuple[int, ...]] = field(default_factory=list)
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
            self.shapes.append(tuple(t.shape))
            if ptr in self._held:
                self.held_bytes += size
                self.held_shapes.append(tuple(t.shape))
            else:
                self.extra_shapes.append(tuple(t.shape))


@contextmanager
def count_saved_tensors(held: Iterable[torch.Tensor] = ()) -> Iterator[SavedLog]:
    """Count the tensors autograd saves for backward inside the ``with`` block.

    Uses ``torch.autograd.graph.saved_tensors_hooks``: the pack hook sees every tensor an op
    saves, and returns it unchanged (nothing is copied or moved). ``held`` lists the tensors the
    program keeps anyway (inputs, parameters); a saved tensor that shares memory with one of them
    (itself, a view, a ``detach()``) counts in ``held_bytes``, everything else in ``extra_bytes``.
    """
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
