"""Public names that pickles record: a class exported by ``funcopt`` pickles as
``funcopt.Name``, and a transformation made by a public factory as that factory and its
arguments (``funcopt.adam(lr=0.1)``), so that funcopt's modules can move without breaking
a user's saved states, transformations and optimizers."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, MutableMapping
from typing import Any

from .base import GradientTransformation


class MadeTransformation(GradientTransformation):
    """A transformation that a public factory made; it pickles (and copies) as a call of
    that factory with the same arguments."""

    def __reduce__(self) -> tuple[Any, ...]:
        recipe = self.__dict__.get("recipe")
        if recipe is None:  # made by _replace or _make: a plain transformation
            return (GradientTransformation, tuple(self))
        factory, args, kwargs = recipe
        return (functools.partial(factory, *args, **kwargs), ())


def remember(
    tx: GradientTransformation, maker: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> GradientTransformation:
    """`tx`, made by ``maker(*args, **kwargs)``, as a transformation that pickles as that
    call (`maker` must pickle under a public name). A wrapper's own kind of transformation,
    or one already remembered, is returned as it is."""
    if type(tx) is not GradientTransformation:
        return tx
    made = MadeTransformation(*tx)
    made.__dict__["recipe"] = (maker, args, kwargs)
    return made


def _returns_transformation(function: Callable[..., Any]) -> bool:
    annotation = inspect.signature(function).return_annotation
    return annotation in ("GradientTransformation", GradientTransformation)


def _recording(factory: Callable[..., GradientTransformation]) -> Callable[..., GradientTransformation]:
    """`factory`, whose transformations remember the call that made them."""

    @functools.wraps(factory)
    def make(*args: Any, **kwargs: Any) -> GradientTransformation:
        return remember(factory(*args, **kwargs), make, args, kwargs)

    return make


def publish(namespace: MutableMapping[str, Any], names: list[str]) -> None:
    """Give the classes among `names` in `namespace` (the package root's) their public
    module, and make its factories record their calls."""
    module = namespace["__name__"]
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type) and obj.__module__.startswith(f"{module}._src."):
            obj.__module__ = module
        elif isinstance(obj, types.FunctionType) and obj.__module__.startswith(f"{module}._src."):
            if _returns_transformation(obj):
                obj = namespace[name] = _recording(obj)
            obj.__module__ = module
