"""`InPlace`, `ForEach` and `Pure` compute the same thing; `ForEach` applies `InPlace`
to each tensor of its lists; `Pure` mutates nothing and never promotes: a float64 0-d
coefficient applied to float32 (or a 0-d float32) stays float32."""

from __future__ import annotations

import pytest
import torch

from funcopt._src.catalogue import distance_math, sm3_math
from funcopt._src.engine import inplace
from funcopt._src.engine.ops import ForEach, Fresh, InPlace, Ops, Pure, PureForEach, TensorList, nonzero
from funcopt._src.torch.fused import OnParam
from funcopt._src.transforms import schedule_free_math

NAMESPACES = [InPlace, ForEach, Pure, PureForEach, OnParam]

# The namespaces of one family's math: an engine namespace, and the family's own ops.
SM3_OPS = {"accumulate", "scaled", "ema", "per_axis"}
DISTANCE_OPS = {"dots", "add_dot", "add_l1", "maximum", "sliced", "no_sum"}
SCHEDULE_FREE_OPS = {"toward_"}
FAMILY_NAMESPACES = [
    (sm3_math.InPlace, InPlace, SM3_OPS),
    (sm3_math.Pure, Pure, SM3_OPS),
    (distance_math.InPlaceLists, ForEach, DISTANCE_OPS),
    (distance_math.ScratchLists, ForEach, DISTANCE_OPS),
    (distance_math.PureLists, PureForEach, DISTANCE_OPS),
    (type(schedule_free_math.FOREACH), ForEach, SCHEDULE_FREE_OPS),
    (type(schedule_free_math.PURE), Pure, SCHEDULE_FREE_OPS),
]


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


@pytest.mark.parametrize(
    "namespace,engine,extra",
    FAMILY_NAMESPACES,
    ids=[f"{n.__module__.rsplit('.', 1)[-1]}.{n.__qualname__}" for n, _, _ in FAMILY_NAMESPACES],
)
def test_family_namespaces_have_every_op(namespace, engine, extra):
    """A family's namespace is an engine namespace with ops of its own: it has each op of
    the protocol, and its own ops are those declared above, none a protocol op's name."""
    assert issubclass(namespace, engine)
    missing = [name for name in _protocol_names() if not callable(getattr(namespace, name, None))]
    assert not missing, f"{namespace.__qualname__} lacks {missing}"
    own = {
        name
        for cls in namespace.__mro__[: namespace.__mro__.index(engine)]
        for name in vars(cls)
        if not name.startswith("_")
    }
    assert not extra & set(_protocol_names())
    assert own - set(_protocol_names()) == extra
    assert all(callable(getattr(namespace, name)) for name in extra)


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


@pytest.mark.parametrize("lists", [ForEach, PureForEach, distance_math.PureLists], ids=lambda n: n.__name__)
@pytest.mark.parametrize("name,n,coefs", CASES, ids=[c[0] for c in CASES])
def test_foreach_is_inplace_on_each_tensor(name, n, coefs, lists):
    """`ForEach` is `InPlace`, `PureForEach` is `Pure`, on each tensor of their lists
    (`PureLists`, `Pure` leaf by leaf, on plain lists)."""
    kwargs = coefs if isinstance(coefs, dict) else {}
    extra = coefs if isinstance(coefs, tuple) else ()
    columns = list(zip(_args(n, (3, 4), torch.float32), _args(n, (), torch.float64)))
    expected = [getattr(InPlace, name)(*[t.clone() for t in ts], *extra, **kwargs) for ts in zip(*columns)]
    args = [TensorList(t.clone() for t in column) for column in columns]
    snapshot = [[t.clone() for t in column] for column in args]
    result = getattr(lists, name)(*args, *extra, **kwargs)
    assert isinstance(result, list if lists is distance_math.PureLists else TensorList) and len(result) == 2
    for r, e in zip(result, expected):
        torch.testing.assert_close(r, e)
    if lists is not ForEach:  # mutates nothing
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


_COEF_FORMS = [lambda c: c, lambda c: torch.tensor(c, dtype=torch.float64)]  # Pure's: numbers, 0-d tensors


@pytest.mark.parametrize("shape", [(3, 4), (5,)], ids=["matrix", "vector"])
def test_sm3_inplace_and_pure_agree(shape):
    """SM3's own ops: `sm3_math.InPlace` writes what `sm3_math.Pure` returns."""
    IP, P = sm3_math.InPlace, sm3_math.Pure
    g, nu, low = _args(3, shape, torch.float32)
    g = g - 1.0
    low.view(-1)[0] = 0.0  # (an accumulator entry at 0: `scaled` gives 0 there)
    snapshot = [t.clone() for t in (g, nu, low)]
    for convert in _COEF_FORMS:
        for c0, c2 in [(0.1, 0.9), (1.0, 1.0)]:
            expected = IP.accumulate(low.clone(), g, c0, c2)
            torch.testing.assert_close(P.accumulate(low, g, convert(c0), convert(c2)), expected)
        accum = low.clone()
        expected = IP.scaled(g, accum, 1e-3)
        torch.testing.assert_close(P.scaled(g, accum, convert(1e-3)), expected)
        assert expected.view(-1)[0] == 0
        torch.testing.assert_close(P.ema(nu, g, convert(0.9)), IP.ema(nu.clone(), g, 0.9))
    if len(shape) == 1:  # the accumulator is the vector itself, written by `accumulate`
        accum = low.clone()
        assert IP.per_axis(accum, [accum])[0] is accum
        torch.testing.assert_close(P.per_axis(low, [low]), [low])
    else:
        mu = [torch.zeros(n) for n in shape]
        expected = IP.per_axis(low, mu)
        assert all(e is m for e, m in zip(expected, mu))
        torch.testing.assert_close(P.per_axis(low, [torch.zeros(n) for n in shape]), expected)
        torch.testing.assert_close(expected, [low.amax(1), low.amax(0)])
    for t, before in zip((g, nu, low), snapshot):
        assert torch.equal(t, before)


@pytest.mark.parametrize("n", [1, 2], ids=["one", "two"])
@pytest.mark.parametrize("in_place", ["IN_PLACE", "ScratchLists"])
def test_distance_inplace_and_pure_agree(in_place, n):
    """Prodigy's and D-Adaptation's own ops: the sums `IN_PLACE` reads on the host are
    `PURE`'s 0-d tensors (`ScratchLists`'s temporaries too: its buffer holds a list of
    one tensor)."""
    IP = distance_math.IN_PLACE if in_place == "IN_PLACE" else distance_math.ScratchLists()
    P = distance_math.PURE
    shapes = [(3, 4), (5,)][:n]
    xs = [_args(1, shape, torch.float32)[0] - 1.0 for shape in shapes]
    ys = [_args(2, shape, torch.float32)[1] for shape in shapes]
    t64 = _COEF_FORMS[1]
    for got, expected in zip(P.dots([(xs, ys), (xs, xs)]), IP.dots([(xs, ys), (xs, xs)])):
        assert float(got) == pytest.approx(expected, rel=1e-6)
    assert float(P.add_dot(t64(0.5), t64(0.3), xs, ys)) == pytest.approx(
        IP.add_dot(0.5, 0.3, xs, ys), rel=1e-6
    )
    assert float(P.add_l1(t64(0.5), t64(0.3), xs)) == pytest.approx(IP.add_l1(0.5, 0.3, xs), rel=1e-6)
    assert float(P.maximum(t64(1.5), torch.tensor(2.5))) == IP.maximum(1.5, 2.5) == 2.5
    assert P.sliced(xs, 1) is xs and IP.sliced(xs, 1) is xs
    torch.testing.assert_close(P.sliced(xs, 2), IP.sliced(xs, 2))
    assert P.no_sum(t64(1.0)) is IP.no_sum(1.0) is False  # (a sum of 0: `IN_PLACE` only reads it)
    # the protocol ops `ScratchLists` writes into its buffer
    torch.testing.assert_close(list(IP.sub(xs, ys)), P.sub(xs, ys))
    torch.testing.assert_close(list(IP.sqrt(ys)), P.sqrt(ys))


def test_schedule_free_inplace_and_pure_agree():
    """Schedule-free's ``toward_``: `FOREACH` moves the params `y` towards `z`, `PURE`
    returns that move as an update (added to one it is given)."""
    FE, P = schedule_free_math.FOREACH, schedule_free_math.PURE
    columns = list(zip(_args(2, (3, 4), torch.float32), _args(2, (), torch.float64)))
    ys, zs = (TensorList(t.clone() for t in column) for column in columns)
    y0 = [t.clone() for t in ys]
    moved = FE.toward_(ys, ys, zs, 0.3)
    assert moved is ys
    for convert in _COEF_FORMS:
        for y, z, m in zip(y0, zs, moved):
            torch.testing.assert_close(y + P.toward_(None, y, z, convert(0.3)), m)
            u = torch.full_like(y, 0.25)
            torch.testing.assert_close(P.toward_(u, y, z, convert(0.3)), u + (m - y))


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
