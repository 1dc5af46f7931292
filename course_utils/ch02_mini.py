"""Chapter 02 (nn.Module), ``nn.Module``'s registration in miniature: ``MiniModule`` files each attribute under
``_parameters``, ``_modules`` or ``_buffers`` as ``nn.Module`` does, with ``MiniLinear`` and ``MiniReLU`` to
build from. Used in the deep dive "`nn.Module`'s registration in a few dozen lines" of notebook 02 (which
prints its ``__setattr__`` and ``__getattr__``), through ``course_utils.ch02_nn_module``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

# --------------------------------------------------------------------------- a miniature nn.Module


class MiniModule:
    """``nn.Module``'s registration in miniature (``torch/nn/modules/module.py``), for reading.

    ``__setattr__`` files each value under ``_parameters``, ``_modules`` or ``_buffers``, with the
    real class's guards; everything else walks those dictionaries.
    """

    def __init__(self) -> None:
        # object.__setattr__ skips our own __setattr__: these dicts must exist before it can run.
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() before assigning attributes")
        if isinstance(value, nn.Parameter):
            self._forget(name)
            self._parameters[name] = value
        elif name in self._parameters:  # a parameter or child-module name accepts only its own kind (or None)
            if value is not None:
                raise self._wrong_kind(name, value, "parameter", "nn.Parameter or None")
            self._parameters[name] = None
        elif isinstance(value, MiniModule):
            self._forget(name)
            self._modules[name] = value
        elif name in self._modules:
            if value is not None:
                raise self._wrong_kind(name, value, "child module", "MiniModule or None")
            self._modules[name] = None
        elif isinstance(value, nn.Buffer):
            self.register_buffer(name, value, persistent=value.persistent)
        elif name in self._buffers:
            if value is not None and not isinstance(value, torch.Tensor):
                raise self._wrong_kind(name, value, "buffer", "Tensor or None")
            self._buffers[name] = value  # re-assigning a buffer keeps it a buffer
        else:
            self._forget(name)
            object.__setattr__(self, name, value)

    @staticmethod
    def _wrong_kind(name: str, value: Any, kind: str, expected: str) -> TypeError:
        return TypeError(f"cannot assign {type(value).__name__!r} as {kind} {name!r} ({expected} expected)")

    def _forget(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            store.pop(name, None)
        self._non_persistent.discard(name)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        # Python calls this only when normal lookup fails: registered values live in the dicts.
        for store in ("_parameters", "_buffers", "_modules"):
            values = self.__dict__.get(store, {})
            if name in values:
                return values[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """A tensor of the module's state that is not trained (e.g. running statistics)."""
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def named_modules(self, prefix: str = "", memo: set[int] | None = None) -> Iterator[tuple[str, MiniModule]]:
        """This module and every sub-module, depth first, each one once."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def _named(self, store: str) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        for mod_name, mod in self.named_modules():
            for name, t in getattr(mod, store).items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    yield (f"{mod_name}.{name}" if mod_name else name), t

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        return self._named("_parameters")

    def parameters(self) -> Iterator[Tensor]:
        return (p for _, p in self.named_parameters())

    def named_buffers(self) -> Iterator[tuple[str, Tensor]]:
        return self._named("_buffers")

    def state_dict(self) -> dict[str, Tensor]:
        """Parameters and persistent buffers by dotted name (the tensors themselves, detached)."""
        out: dict[str, Tensor] = {}
        for mod_name, mod in self.named_modules():
            dot = f"{mod_name}." if mod_name else ""
            for name, p in mod._parameters.items():
                if p is not None:
                    out[dot + name] = p.detach()
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent:
                    out[dot + name] = b.detach()
        return out

    def train(self, mode: bool = True) -> MiniModule:
        for _, mod in self.named_modules():
            object.__setattr__(mod, "training", mode)
        return self

    def eval(self) -> MiniModule:
        return self.train(False)

    def __call__(self, *args: Any) -> Any:
        return self.forward(*args)  # the real one also runs the hooks around this call


class MiniLinear(MiniModule):
    """``y = x W^T + b`` on the miniature base class, initialised exactly like ``nn.Linear``."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        # borrow the real initialisation (the same random draws)
        ref = nn.Linear(in_features, out_features)
        self.weight = nn.Parameter(ref.weight.detach().clone())
        self.bias = nn.Parameter(ref.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T + self.bias


class MiniReLU(MiniModule):
    """ReLU on the miniature base class (no parameters)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x)
