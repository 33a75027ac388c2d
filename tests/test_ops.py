"""`InPlace`, `ForEach` and `Pure` compute the same thing; `ForEach` applies `InPlace`
to each tensor of its lists; `Pure` mutates nothing and never promotes: a float64 0-d
coefficient applied to float32 (or a 0-d float32) stays float32."""

from __future__ import annotations

import pytest
import torch

from funcopt._src.engine import inplace
from funcopt._src.engine.ops import ForEach, Fresh, InPlace, Ops, Pure, PureForEach, TensorList, nonzero
from funcopt._src.torch.fused import OnParam

NAMESPACES = [InPlace, ForEach, Pure, PureForEach, OnParam]


def _protocol_names():
    return sorted(name for name in vars(Ops) if not name.startswith("_"))


@pytest.mark.parametrize("namespace", NAMESPACES, ids=lambda n: n.__name__)
def test_every_namespace_has_every_op(namespace):
    """An algorithm's math written against the `Ops` protocol runs on every face: each
    namespace has each op the protocol declares, and the protocol declares each op any
    namespace has (a new op is declared, then given to all)."""
    missing = [name for name in _protocol_names() if not callable(getattr(namespace, name, None))]
    assert not missing, f"{namespace.__name__} lacks {missing}"
    own = {name for name in vars(namespace) if not name.startswith("_")}
    assert own <= set(_protocol_names()), f"undeclared ops: {sorted(own - set(_protocol_names()))}"


def test_cases_cover_the_protocol():
    """Each op of the protocol is compared across the namespaces below (by CASES, or by a
    test of its own)."""
    own_tests = {"where", "masked_fill", "masked_fill_", "item", "decay_", "new_param"}
    assert set(_protocol_names()) == {case[0] for case in CASES} | own_tests


# name, tensor arguments (by shape), coefficients (keyword or trailing positional)
CASES = [
    ("neg", 1, {}),
    ("abs", 1, {}),
    ("tanh", 1, {}),
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
    ("sign", 1, {}),
    ("sign_", 1, {}),
    ("sub", 2, {}),
    ("mul", 2, {}),
    ("mul", 1, (0.3,)),
    ("addcmul", 3, {"value": 0.2}),
    ("clone", 1, {}),
    ("lerp", 2, (0.25,)),
    ("reciprocal_", 1, {}),
    ("copy_", 2, {}),
    ("clamp_", 1, (0.6, 1.2)),
    ("gt", 1, (0.9,)),
    ("lt", 1, (0.9,)),
    ("eq", 1, (0.5,)),
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
        assert result.dtype == (torch.bool if name in ("gt", "lt", "eq") else dtype)
        torch.testing.assert_close(result, expected)
        for a, s in zip(args, snapshot):
            assert torch.equal(a, s)


@pytest.mark.parametrize("lists", [ForEach, PureForEach], ids=lambda n: n.__name__)
@pytest.mark.parametrize("name,n,coefs", CASES, ids=[c[0] for c in CASES])
def test_foreach_is_inplace_on_each_tensor(name, n, coefs, lists):
    """`ForEach` is `InPlace`, `PureForEach` is `Pure`, on each tensor of their lists."""
    kwargs = coefs if isinstance(coefs, dict) else {}
    extra = coefs if isinstance(coefs, tuple) else ()
    columns = list(zip(_args(n, (3, 4), torch.float32), _args(n, (), torch.float64)))
    expected = [getattr(InPlace, name)(*[t.clone() for t in ts], *extra, **kwargs) for ts in zip(*columns)]
    args = [TensorList(t.clone() for t in column) for column in columns]
    snapshot = [[t.clone() for t in column] for column in args]
    result = getattr(lists, name)(*args, *extra, **kwargs)
    assert isinstance(result, TensorList)
    for r, e in zip(result, expected):
        torch.testing.assert_close(r, e)
    if lists is PureForEach:  # mutates nothing
        for column, before in zip(args, snapshot):
            torch.testing.assert_close(list(column), before, rtol=0, atol=0)
        return
    if name.endswith("_"):
        assert result is args[0]
    p, out = TensorList(args[0]), TensorList(t.clone() + 1 for t in args[0])
    expected = [InPlace.decay_(o.clone(), q, 0.9) for o, q in zip(out, p)]
    torch.testing.assert_close(ForEach.decay_(out, p, 0.9), expected)
    expected = [q * 0.9 for q in p]
    torch.testing.assert_close(ForEach.decay_(p, p, 0.9), expected)


@pytest.mark.parametrize("namespace", NAMESPACES, ids=lambda n: n.__name__)
def test_where_masked_fill_and_item_agree(namespace):
    """The ops that take a condition, and ``item``, give on lists what they give per tensor."""
    x, y = _args(2, (3,), torch.float32)
    mask = x > 0.9
    lists = namespace in (ForEach, PureForEach)
    wrap = (lambda t: TensorList([t, t * 2])) if lists else (lambda t: t)
    unwrap = (lambda r: r) if lists else (lambda r: [r])
    expected = {
        "where": [torch.where(mask, x, y), torch.where(mask, 2 * x, 2 * y)],
        "masked_fill": [x.masked_fill(mask, 0.0), (2 * x).masked_fill(mask, 0.0)],
    }
    masks = TensorList([mask, mask]) if lists else mask
    torch.testing.assert_close(
        list(unwrap(namespace.where(masks, wrap(x), wrap(y)))), expected["where"][: 2 if lists else 1]
    )
    for name in ("masked_fill", "masked_fill_"):
        got = getattr(namespace, name)(wrap(x.clone()), masks, 0.0)
        torch.testing.assert_close(list(unwrap(got)), expected["masked_fill"][: 2 if lists else 1])
    norm = wrap(x.sum())
    values = [float(v) for v in unwrap(namespace.item(norm))]
    assert values == pytest.approx([float(x.sum()), float(2 * x.sum())][: 2 if lists else 1], rel=1e-6)


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
