"""Binding a call's arguments to a tool's parameters: a shortcut beside ``inspect.Signature.bind``.

The specification is ``sig.bind(*args, **kwargs)`` followed by ``apply_defaults()``. For the common signature
(named parameters only: no ``*args``, ``**kwargs`` or positional-only ones) the same mapping is built
directly from the parameter names fixed at decoration, which costs a fraction of ``Signature.bind``; anything
else, and every mistake, goes through ``Signature.bind`` for its exact ``TypeError``. tests/core/test_guard.py
compares both on valid and invalid calls.
"""

from __future__ import annotations

import inspect
from typing import Any


class Binder:
    __slots__ = ("all_names", "defaults", "n_positional", "name_set", "pos_names", "signature", "simple")

    def __init__(self, signature: inspect.Signature) -> None:
        self.signature = signature
        params = signature.parameters
        kinds = [p.kind for p in params.values()]
        self.simple = all(k in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
                          for k in kinds)
        self.pos_names = tuple(n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.all_names = tuple(params)
        # (-1: never; some parameter is keyword-only, *args or **kwargs)
        self.n_positional = len(self.pos_names) if self.simple and len(self.pos_names) == len(self.all_names) else -1
        self.name_set = frozenset(self.all_names)
        self.defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if not kwargs and len(args) == self.n_positional:  # every parameter passed by position
            return dict(zip(self.pos_names, args))  # noqa: B905 - equal lengths, just checked (strict= costs)
        if self.simple and len(args) <= len(self.pos_names):
            arguments = dict(zip(self.pos_names, args, strict=False))
            ok = True
            for k, v in kwargs.items():
                if k in arguments or k not in self.name_set:
                    ok = False
                    break
                arguments[k] = v
            if ok and len(arguments) < len(self.all_names):
                for n in self.all_names:
                    if n not in arguments:
                        if n not in self.defaults:
                            ok = False
                            break
                        arguments[n] = self.defaults[n]
            if ok:
                return arguments
        return self.general(args, kwargs)

    def general(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The specification: ``Signature.bind`` and ``apply_defaults``."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)
