"""Unpickling that builds numpy arrays and plain values only.

A pickle can call any importable function while it loads (os.system, eval...), so a
hostile file could run code. `ArraysOnly` refuses every global outside a short list
before the name is even looked up: what CIFAR-10's batch files and `paddle.save`'s state
dicts hold, written by numpy 1 or 2, Python 2 or 3.

Example:
    data = ArraysOnly(f, "latin1", refuse=lambda name: ValueError(f"refers to {name}")).load()
"""

from __future__ import annotations

import pickle
from typing import BinaryIO, Callable

# numpy's array reconstruction under its numpy 1 and numpy 2 names; _codecs.encode, how
# Python 3 writes bytes at protocol 2; plain builtin types, whose Python 2 module is
# __builtin__; OrderedDict, which paddle.save may write for a state dict.
ALLOWED = frozenset(
    [(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")]
    + [("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"), ("collections", "OrderedDict")]
    + [(m, n) for m in ("builtins", "__builtin__") for n in ("bool", "bytearray", "bytes", "complex",
       "dict", "float", "frozenset", "int", "list", "set", "slice", "str", "tuple")])


class ArraysOnly(pickle.Unpickler):
    """An Unpickler of ALLOWED globals only; any other raises `refuse("module.name")`."""

    def __init__(self, file: BinaryIO, encoding: str, refuse: Callable[[str], Exception]):
        super().__init__(file, encoding=encoding)
        self.refuse = refuse

    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise self.refuse(f"{module}.{name}")
        return super().find_class(module, name)
