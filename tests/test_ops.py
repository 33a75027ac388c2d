"""`InPlace`, `ForEach` and `Pure` compute the same thing; `ForEach` applies `InPlace`
to each tensor of its lists; `Pure` mutates nothing and never promotes: a float64 0-d
coefficient applied to float32 (or a 0-d float32) stays float32."""

from __future__ import annotations

import pytest
import torch

from funcopt._src.engine import inplace
from funcopt._src.engine.ops import ForEach, Fresh, InPlace, Pure, TensorList, nonzero

# name, tensor arguments (by shape), coefficients (keyword or trailing positional)
CASES = [
    ("neg", 1, {}),
    ("abs", 1, {}),
    ("sqrt", 1, {}),
    ("add", 2, {"alpha": 0.3}),
    ("add", 1, (1e-3,)),
    ("add_", 2, {"alpha": -0.7}),
    ("mul_", 1, (0.9,)),
    ("div", 1, (1.7,)),
    ("div_", 2, {}),
    ("lerp_", 2, (0.1,)),
    ("addcmul_", 3, {"value": 0.05}),
    ("addcdiv_", 3, {"value": -0.02}),
    ("maximum_", 2, {}),
    ("sqrt_", 1, {}),
]


def _args(n, shape, dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.rand(shape, generator=g, dtype=dtype) + 0.5 for _ in range(n)]


@pytest.mark.parametrize("shape", [(3, 4), ()], ids=["matrix", "0-d"])
@pytest.mark.parametrize("name,n,coefs", CASES, ids=[c[0] for c in CASES])
def test_inplace_and_pure_agree(name, n, coefs, shape):
    dtype = torch.float32
    args = _args(n, shape, dtype)
    kwargs = coefs if isinstance(coefs, dict) else {}
    extra = coefs if isinstance(coefs, tuple) else ()
    inplace_args = [a.clone() for a in args]
    expected = getattr(InPlace, name)(*inplace_args, *extra, **kwargs)
    if name.endswith("_"):
        assert (
            expected is inplace_args[0]
            or name in ("maximum_",)
            and expected.data_ptr() == inplace_args[0].data_ptr()
        )
    snapshot = [a.clone() for a in args]
    as_tensor = lambda c: torch.tensor(c, dtype=torch.float64)  # noqa: E731
    for convert in (lambda c: c, as_tensor):
        result = getattr(Pure, name)(
            *args, *[convert(c) for c in extra], **{k: convert(v) for k, v in kwargs.items()}
        )
        assert result.dtype == dtype
        torch.testing.assert_close(result, expected)
        for a, s in zip(args, snapshot):
            assert torch.equal(a, s)


@pytest.mark.parametrize("name,n,coefs", CASES, ids=[c[0] for c in CASES])
def test_foreach_is_inplace_on_each_tensor(name, n, coefs):
    kwargs = coefs if isinstance(coefs, dict) else {}
    extra = coefs if isinstance(coefs, tuple) else ()
    columns = list(zip(_args(n, (3, 4), torch.float32), _args(n, (), torch.float64)))
    expected = [getattr(InPlace, name)(*[t.clone() for t in ts], *extra, **kwargs) for ts in zip(*columns)]
    args = [TensorList(t.clone() for t in column) for column in columns]
    result = getattr(ForEach, name)(*args, *extra, **kwargs)
    assert isinstance(result, TensorList)
    if name.endswith("_"):
        assert result is args[0]
    for r, e in zip(result, expected):
        torch.testing.assert_close(r, e)
    p, out = TensorList(args[0]), TensorList(t.clone() + 1 for t in args[0])
    expected = [InPlace.decay_(o.clone(), q, 0.9) for o, q in zip(out, p)]
    torch.testing.assert_close(ForEach.decay_(out, p, 0.9), expected)
    expected = [q * 0.9 for q in p]
    torch.testing.assert_close(ForEach.decay_(p, p, 0.9), expected)


def test_pure_accumulates_into_a_zero_update():
    x, y = _args(2, (4,), torch.float32)
    torch.testing.assert_close(Pure.add_(None, x, alpha=0.5), x * 0.5)
    torch.testing.assert_close(Pure.addcdiv_(None, x, y, value=2.0), x / y * 2)
    # decay_ multiplies the param: `out` is the param itself, or an update to it
    p = x.clone()
    torch.testing.assert_close(InPlace.decay_(p, p, 0.9), x * 0.9)
    torch.testing.assert_close(x + Pure.decay_(None, x, 0.9), x * 0.9)
    torch.testing.assert_close(Pure.decay_(y, x, 0.9), (x + y) * 0.9 - x)
    torch.testing.assert_close(InPlace.decay_(y.clone(), x, 0.9), (x + y) * 0.9 - x)


def test_fresh_memory_stands_for_a_zero_update():
    """`InPlace` ops given `Fresh` memory (garbage in it) assign to it what they would
    accumulate into zeros, and return the plain tensor; a step that never writes the
    update leaves zeros (`inplace.run`)."""
    x, y = _args(2, (4,), torch.float32)
    for name, args, kwargs in [("add_", (x,), {"alpha": 0.5}), ("addcdiv_", (x, y), {"value": 2.0})]:
        memory = torch.full((4,), float("nan"))
        out = getattr(InPlace, name)(Fresh(memory), *args, **kwargs)
        assert out is memory
        torch.testing.assert_close(out, getattr(InPlace, name)(torch.zeros(4), *args, **kwargs))
    memory = torch.full((4,), float("nan"))
    torch.testing.assert_close(InPlace.decay_(Fresh(memory), x, 0.9), x * 0.9 - x)
    torch.testing.assert_close(InPlace.add_(InPlace.add_(Fresh(memory), x), y), x + y)  # then accumulates

    class Untouched:
        def elementwise(self, o, out, p, g, coefficients):
            return out, ()

    memory = torch.full((4,), float("nan"))
    inplace.run(Untouched(), (), {}, Fresh(memory), x, y, [])
    torch.testing.assert_close(memory, torch.zeros(4))


def test_nonzero():
    assert not nonzero(0) and not nonzero(0.0) and nonzero(0.1)
    assert nonzero(torch.tensor(0.0))  # tensors are never read in Python
