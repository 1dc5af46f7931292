"""What an answer did while a check ran it, beyond what it returned: how many tensor operations it ran
and the largest tensor it made (``counting_ops``), whether autograd's engine ran a graph
(``engine_runs``), and the global module hooks it left behind (``global_module_hooks``, which also
removes them). Chapter checkers use them to judge a constraint or an after-effect that no returned
value shows: an HVP that built the Hessian, a backward pass that asked autograd, a hook never removed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.modules import module as _module
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class _Counter(TorchDispatchMode):
    """Counts every ATen operation that runs under it (the backward passes' too) and notes the largest
    tensor any of them returned."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.largest = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # False: TorchDispatchMode then leaves __torch_dispatch__ unwrapped by torch._disable_dynamo, whose
        # first call imports torch._dynamo (sympy: seconds, and an import a kernel interrupt leaves half
        # done, breaking every later check). Nothing here is ever compiled.
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest = t.numel()
        return out


@dataclass
class OpCount:
    """What ran under :func:`counting_ops`: ``ops`` operations, the largest result ``largest`` elements."""

    ops: int = 0
    largest: int = 0


@contextlib.contextmanager
def counting_ops() -> Iterator[OpCount]:
    """Count the tensor operations run inside the block (forward, backward and double backward alike)
    and the size of the largest tensor made; the counts are filled in when the block ends."""
    counter, seen = _Counter(), OpCount()
    try:
        with counter:
            yield seen
    finally:
        seen.ops, seen.largest = counter.ops, counter.largest


def graph_nodes(out: torch.Tensor) -> list[Any]:
    """Every node of the autograd graph that ends at `out` (each once)."""
    found, stack = {}, [out.grad_fn] if out.grad_fn is not None else []
    while stack:
        node = stack.pop()
        if id(node) in found:
            continue
        found[id(node)] = node
        stack += [nxt for nxt, _ in node.next_functions if nxt is not None]
    return list(found.values())


@dataclass
class EngineRuns:
    """How many nodes autograd's engine ran inside :func:`engine_runs` (0: the answer never asked it)."""

    nodes: int = 0
    handles: list = field(default_factory=list, repr=False)


@contextlib.contextmanager
def engine_runs(out: torch.Tensor) -> Iterator[EngineRuns]:
    """Whether autograd's engine runs any node of `out`'s graph inside the block, whatever name it was
    reached through (``backward()``, ``torch.autograd.grad`` bound before the check, ``functional``):
    a pre-hook on each node fires when the engine runs it, never when Python calls the node itself."""
    runs = EngineRuns()

    def seen(grad_outputs: Any) -> None:
        runs.nodes += 1

    try:
        runs.handles = [node.register_prehook(seen) for node in graph_nodes(out)]
        yield runs
    finally:
        for handle in runs.handles:
            handle.remove()


_HOOK_DICTS = (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks", "_global_backward_hooks",
    "_global_buffer_registration_hooks", "_global_module_registration_hooks", "_global_parameter_registration_hooks",
)


@dataclass
class LeftHooks:
    """The global module hooks (``register_module_forward_hook`` and friends) added inside
    :func:`global_module_hooks` and still registered when it ended: their kinds, one entry each."""

    kinds: list[str] = field(default_factory=list)


@contextlib.contextmanager
def global_module_hooks() -> Iterator[LeftHooks]:
    """Note the global module hooks an answer registers and leaves behind, and remove them when the block
    ends: a check must not leave a learner's session with a hook that runs on every module call."""
    before = {name: set(getattr(_module, name)) for name in _HOOK_DICTS}
    left = LeftHooks()
    try:
        yield left
    finally:
        for name in _HOOK_DICTS:
            hooks = getattr(_module, name)
            for key in [k for k in hooks if k not in before[name]]:
                left.kinds.append(name.removeprefix("_global_").rstrip("s").replace("_", " "))
                del hooks[key]
                for extra in ("_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs"):
                    getattr(_module, extra).pop(key, None)
