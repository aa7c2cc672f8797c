"""What ``torch.compile`` runs eagerly: the compiled graph breaks around moe-core's entry points (dynamo cannot trace
attrs' frozen constructors, and the layers launch their own kernels)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

Fn = TypeVar("Fn", bound=Callable[..., object])
C = TypeVar("C", bound=type)


def run_eagerly(function: Fn) -> Fn:
    """``function`` run eagerly under ``torch.compile``: the compiled graph breaks around it. Called outside a trace
    (eager code, or inside another function run eagerly) it is ``function`` itself behind one flag test: torch's
    disabled wrapper costs about 1 us a call, and a layer's call goes through several of these."""
    disabled = torch.compiler.disable(function)  # type: ignore[no-untyped-call]  # torch leaves disable untyped

    @functools.wraps(function)
    def eager(*args: object, **kwargs: object) -> object:
        if torch.compiler.is_dynamo_compiling():
            return disabled(*args, **kwargs)
        return function(*args, **kwargs)

    return eager  # type: ignore[return-value]  # functools.wraps gives eager function's signature, which mypy cannot see


def constructed_eagerly(cls: C) -> C:
    """``cls`` with its constructor run eagerly under ``torch.compile``: a compiled forward that builds a top-k or a
    dispatch itself failed inside dynamo with a raw ``AssertionError`` on attrs' frozen ``__init__`` (adversarial
    pass 20, d04)."""
    setattr(cls, "__init__", run_eagerly(vars(cls)["__init__"]))
    return cls
