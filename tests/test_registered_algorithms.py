"""The generic suites over every registered algorithm, torch twin or not.

Every `Algorithm` in ``REGISTRY`` (collected when this module is imported, so a new
algorithm is picked up by itself) is checked with its default hyperparameters and each
option set that changes its math, over a few float64 steps of a small params dict of
mixed shapes:

- its faces agree: ``algorithm.transform``, the public factory, ``fo.Optimizer`` over the
  algorithm and the public class, the latter two with foreach on and off and ``fused=True``
  (compiled kernels: slow);
- its first step descends (ascends with maximize);
- its update is pure, and its functional state keeps one structure from init on (grads, state and params untouched);
- ``vmap`` over 3 param sets equals 3 runs, ``grad`` through 2 steps matches finite
  differences (lr) and autograd (initial params), ``torch.compile(fullgraph=True)``
  matches eager (slow);
- each `Bound` raises torch's ``ValueError`` (torch's own message where torch has the class);
- a ``state_dict`` round trip and pickles of the optimizer, transformation and state step on
  the same.

The values come from the algorithm's drop-in class (its defaults, as its param groups hold
them), ``helpers.HYPER`` for a class torch also has, and otherwise from the defaults and
bounds (see `away_from_defaults`). Tolerances: faces that run the same operations agree
bit for bit; the others (the functional path against the in-place one) to float64
round-off.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import pickle
import re
from dataclasses import dataclass
from typing import Any

import optree
import pytest
import torch
from helpers import HYPER, IMPLEMENTATION_FLAGS, assert_same, kwargs_of, set_default_dtype
from torch.func import grad, vmap

import funcopt as fo
from funcopt._src.engine import inplace
from funcopt._src.engine.algorithm import REGISTRY, Algorithm

STEPS = 3
ROUND_OFF = {"rtol": 1e-10, "atol": 1e-12}
EXACT = {"rtol": 0.0, "atol": 0.0}
# fused=True keeps the counters in float32 (as torch's fused classes keep step), so the
# per-step scalars computed from them (ASGD's eta) round in float32
FUSED = {"rtol": 1e-6, "atol": 1e-9}

# Option sets that change the math and are no boolean of the class (those are found by
# themselves, see `option_sets`), on top of the values away from the defaults.
EXTRA_OPTIONS: dict[str, list[dict[str, Any]]] = {
    "ASGD": [{"t0": 1.0}],  # the average starts at step 1 (state.ax), not at step 10**6
    "Muon": [{"adjust_lr_fn": "original"}, {"adjust_lr_fn": "match_rms_adamw"}],
    "Rprop": [{"step_sizes": (1e-3, 0.15)}],  # a clamp that acts, both ways
    "Adafactor": [{"eps": (None, 1e-3)}],  # eps1 derived from the dtype
}
# Hyperparameters of the functional face for the torch.func checks, where the default rounds
# below float64: Muon orthogonalizes in bfloat16 (ns_dtype), where batched and separate
# matrix products round apart and finite differences see the rounding. (Its default is
# checked by the faces, pickles and compile.)
FLOAT64_MATH: dict[str, dict[str, Any]] = {"Muon": {"ns_dtype": torch.float64}}
# What an option needs besides (torch refuses it otherwise): SGD's Nesterov needs no dampening.
OPTION_NEEDS: dict[tuple[str, str], dict[str, Any]] = {
    ("SGD", "nesterov"): {"dampening": 0.0},
    ("Lars", "nesterov"): {"dampening": 0.0},
}
# Options of a drop-in class that the algorithm's other faces do not run, set in each of
# its option sets: fo.Lamb's clip of the gradients' global norm, over all param groups
# (tests/test_timm_reference.py checks it against timm).
CLASS_ONLY: dict[str, dict[str, Any]] = {"Lamb": {"max_grad_norm": None}}
# An algorithm that a class steps for one option only: the class, and that option, set in
# each of its option sets (and flipped in none of the class's own algorithm's): fo.Adan
# steps CautiousAdan with caution=True (per tensor), Adan without (per element).
BY_OPTION: dict[str, tuple[str, dict[str, Any]]] = {"CautiousAdan": ("Adan", {"caution": True})}


# -- the algorithms and their option sets -----------------------------------------------


def drop_in_class(algorithm: Algorithm) -> type[fo.Optimizer] | None:
    """The public class that steps `algorithm` (``fo.Lion`` for Lion), or None."""
    name, fixed = BY_OPTION.get(algorithm.name, (algorithm.name, {}))
    cls = getattr(fo, name, None)
    if not (isinstance(cls, type) and issubclass(cls, fo.Optimizer)):
        return None
    return cls if cls([torch.zeros(2, 2, requires_grad=True)], **fixed)._transform is algorithm else None


def class_options(cls: type) -> dict[str, Any]:
    """The class's arguments with their defaults, less the params and torch's switches."""
    parameters = list(inspect.signature(cls).parameters.values())[1:]
    return {p.name: p.default for p in parameters if p.name not in IMPLEMENTATION_FLAGS}


def away_from_defaults(algorithm: Algorithm, defaults: dict[str, Any]) -> dict[str, Any]:
    """Values that change the result, for an algorithm without a `HYPER` entry: lr 0.05, a
    zero 0.05, another float (a pair element by element) 0.8 times its default (inside any
    bound of the form ``0 <= x < high``); counts (ints other than 0), flags and None kept."""

    def away(key: str, value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(away(key, v) for v in value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value  # flags, None, strings (Muon's adjust_lr_fn)
        if isinstance(value, int) and value:
            return value  # counts (Muon's ns_steps)
        return 0.05 if key == "lr" or value == 0 else 0.8 * value

    bounded = {b.key for b in algorithm.bounds if isinstance(b, fo.Bound)}
    return {k: away(k, v) for k, v in defaults.items() if k in bounded or isinstance(v, float)}


@dataclass(frozen=True)
class Case:
    """One algorithm with one option set: `kwargs` for its class, `hyperparams` for the engine."""

    algorithm: Algorithm
    cls: type[fo.Optimizer]
    label: str
    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return self.algorithm.name

    @functools.cached_property
    def hyperparams(self) -> dict[str, Any]:
        """The algorithm's hyperparameters, as the class's param groups hold them (AdamW's
        decoupled_weight_decay included), less torch's switches."""
        defaults = self.cls([torch.zeros(2, 2, requires_grad=True)], **self.kwargs).defaults
        return {k: v for k, v in defaults.items() if k not in IMPLEMENTATION_FLAGS}

    def __repr__(self) -> str:
        return f"{self.name}-{self.label}"


def option_sets(algorithm: Algorithm, cls: type[fo.Optimizer]) -> list[tuple[str, dict[str, Any]]]:
    """The defaults; values away from them (`HYPER`, else `away_from_defaults`); and on top
    of those, each boolean option of the class flipped, and each `EXTRA_OPTIONS` entry."""
    defaults = class_options(cls)
    name = algorithm.name
    away = kwargs_of(HYPER[name]) if name in HYPER else away_from_defaults(algorithm, defaults)
    sets = [("defaults", {}), ("away", away)]
    fixed = BY_OPTION.get(name, (name, {}))[1]
    chosen = {k for cls_name, options in BY_OPTION.values() if cls_name == cls.__name__ for k in options}
    for option, default in defaults.items():
        if isinstance(default, bool) and option not in chosen:
            needs = OPTION_NEEDS.get((name, option), {})
            sets.append((f"{option}={not default}", {**away, **needs, option: not default}))
    for extra in EXTRA_OPTIONS.get(name, []):
        sets.append(("+".join(f"{k}={v}" for k, v in extra.items()), {**away, **extra}))
    return [(label, {**kwargs, **CLASS_ONLY.get(name, {}), **fixed}) for label, kwargs in sets]


def built_in(algorithm: Algorithm) -> bool:
    """Whether `algorithm` is funcopt's own (not one a user, or the docs, registered)."""
    return algorithm.state.__module__.startswith("funcopt.")


def cases() -> list[Case]:
    """Each registered algorithm with its option sets. One without a drop-in class (a user's,
    made while this module was imported) is left out: the class gives the defaults;
    `test_every_registered_algorithm_is_covered` requires one for each built-in."""
    out = []
    for algorithm in list(REGISTRY.values()):
        cls = drop_in_class(algorithm)
        if cls is not None:
            out += [Case(algorithm, cls, label, kwargs) for label, kwargs in option_sets(algorithm, cls)]
    return out


CASES = cases()
DEFAULT_CASES = [c for c in CASES if c.label in ("defaults", "away")]


def ids(case: Case) -> str:
    return repr(case)


# -- the problem: params of mixed shapes, gradients from a smooth loss ------------------


def _steps_on(algorithm: Algorithm, hyperparams: dict[str, Any], grads: dict[str, torch.Tensor]) -> bool:
    """Whether one functional step takes these gradients (shaped as their params)."""
    params = {k: torch.zeros(g.shape, dtype=torch.float64) for k, g in grads.items()}
    tx = algorithm.transform(**hyperparams)
    try:
        tx.update(grads, tx.init(params), params)
    except (ValueError, RuntimeError):
        return False
    return True


@functools.cache
def kind(name: str) -> str:
    """How `name` steps, found by trying: "any" params, "matrices" only (Muon), or "sparse"
    gradients only (SparseAdam)."""
    case = next(c for c in CASES if c.name == name)
    matrix = {"w": torch.ones(3, 2, dtype=torch.float64)}
    if not _steps_on(case.algorithm, case.hyperparams, matrix):
        return "sparse"
    vector = {"v": torch.ones(3, dtype=torch.float64)}
    return "any" if _steps_on(case.algorithm, case.hyperparams, vector) else "matrices"


def shapes(name: str) -> dict[str, tuple[int, ...]]:
    """A matrix of more than `inplace.TINY`'s test value of elements, a vector, a 0-d tensor
    (matrices of three shapes where the algorithm steps matrices only)."""
    if kind(name) == "matrices":
        return {"w": (4, 3), "v": (2, 5), "u": (1, 3)}
    return {"w": (4, 3), "b": (3,), "s": ()}


def make_params(name: str, seed: int = 0, batch: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn((*batch, *s), generator=gen, dtype=torch.float64) for k, s in shapes(name).items()}


def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """A smooth objective whose gradients vary in sign and size: sum(sin(2p) + p^2 / 2)."""
    return sum((torch.sin(2 * p) + p * p / 2).sum() for p in params.values())


def gradients(
    name: str, params: dict[str, torch.Tensor], steps: int = STEPS
) -> list[dict[str, torch.Tensor]]:
    """Random gradients, one tree per step (sparse COO where the algorithm takes no other,
    holding about half the entries)."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        grads = {k: torch.randn(p.shape, generator=gen, dtype=p.dtype) for k, p in params.items()}
        if kind(name) == "sparse":
            grads = {k: (g * (g > 0)).to_sparse() for k, g in grads.items()}
        out.append(grads)
    return out


def skip_if_sparse(name: str, what: str) -> None:
    if kind(name) == "sparse":
        pytest.skip(f"{name} steps on sparse gradients only, and {what} does not take sparse tensors")


# -- running each face ------------------------------------------------------------------


def run_functional(tx: fo.GradientTransformation, params: Any, grads_seq: list[Any]) -> tuple[Any, Any]:
    state = tx.init(params)
    for grads in grads_seq:
        updates, state = tx.update(grads, state, params)
        params = fo.apply_updates(params, updates)
    return params, state


def as_leaves(params: dict[str, torch.Tensor]) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(p.clone()) for p in params.values()]


def step(opt: torch.optim.Optimizer, ps: list[torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
    for p, g in zip(ps, grads.values()):
        p.grad = g.clone()
    opt.step()


def run_class(opt: torch.optim.Optimizer, ps: list[torch.Tensor], grads_seq: list[Any]) -> list[torch.Tensor]:
    for grads in grads_seq:
        step(opt, ps, grads)
    return [p.detach() for p in ps]


def faces(case: Case, *, fused: bool = False) -> dict[str, Any]:
    """Each in-place face built for `case`: (optimizer, its params)."""
    params = make_params(case.name)
    out = {}
    for foreach in (False, True):
        ps = as_leaves(params)
        out[f"fo.Optimizer foreach={foreach}"] = (
            fo.Optimizer(ps, case.algorithm, **case.hyperparams, foreach=foreach),
            ps,
        )
        if "foreach" in inspect.signature(case.cls).parameters:
            ps = as_leaves(params)
            out[f"{case.name} foreach={foreach}"] = (case.cls(ps, **case.kwargs, foreach=foreach), ps)
    if fused:
        ps = as_leaves(params)
        out["fo.Optimizer fused"] = (fo.Optimizer(ps, case.algorithm, **case.hyperparams, fused=True), ps)
        ps = as_leaves(params)
        out[f"{case.name} fused"] = (case.cls(ps, **case.kwargs, fused=True), ps)
    return out


def public_factory(case: Case) -> fo.GradientTransformation | None:
    """The public factory (``fo.adamw``) with the class's arguments, or None where it takes
    others (``fo.lion`` takes optax's: tests/test_lion.py checks it against the class)."""
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", case.name).lower()
    factory = getattr(fo, case.name.lower(), None) or getattr(fo, snake, None)
    if factory is None:
        return None
    accepted = inspect.signature(factory).parameters
    if not set(class_options(case.cls)) <= set(accepted):
        return None
    return factory(**{k: v for k, v in case.hyperparams.items() if k in accepted})


def assert_tree_close(actual: Any, expected: Any, **tol: Any) -> None:
    a, b = optree.tree_leaves(actual, none_is_leaf=True), optree.tree_leaves(expected, none_is_leaf=True)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(y, torch.Tensor):
            x, y = x.to_dense() if x.is_sparse else x, y.to_dense() if y.is_sparse else y
        torch.testing.assert_close(x, y, **tol)


def clone_tree(tree: Any) -> Any:
    return optree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, tree, none_is_leaf=True)


# -- faces agree --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def float64_counters():
    """The default dtype float64, so that the classes' counters (step, NAdam's mu_product),
    in torch's default dtype, are float64 like the functional state's: the faces then
    differ by float64 round-off only."""
    with set_default_dtype(torch.float64):
        yield


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_faces_agree(case, monkeypatch):
    """The functional transformation, the public factory (same operations: bit for bit),
    and the in-place faces (to round-off): with all params in the in-place step's chunks
    (fused=True too, stepping in place: small params compile no kernel), then with the
    matrix in blocks."""
    params = make_params(case.name)
    grads_seq = gradients(case.name, params)
    expected, state = run_functional(case.algorithm.transform(**case.hyperparams), params, grads_seq)
    factory = public_factory(case)
    if factory is not None:
        got, got_state = run_functional(factory, params, grads_seq)
        assert_same(got, expected, **EXACT)
        assert_tree_close(got_state, state, **EXACT)
    for tiny in (inplace.TINY, 8):
        monkeypatch.setattr(inplace, "TINY", tiny)
        for label, (opt, ps) in faces(case, fused=fusable(case) and tiny > 8).items():
            tol = FUSED if "fused" in label else ROUND_OFF
            assert_same(
                dict(zip(params, run_class(opt, ps, grads_seq))), expected, f"{label} TINY={tiny}", **tol
            )
            assert_tree_close(fo.functional_state(opt, dict(zip(params, ps))), as_torch_counts(state), **tol)


def as_torch_counts(state: Any) -> Any:
    """`state` as converted from a torch-format optimizer: SGD's class keeps no step count
    (its functional form counts, for its dampening), so a converted one is 1 once stepped."""
    if isinstance(state, fo.ScheduledState):
        return state._replace(count=torch.clamp(state.count, max=1))
    return state


def fusable(case: Case) -> bool:
    """Whether `case` has a fused step: per-element math on dense gradients."""
    return case.algorithm.per_element and kind(case.name) != "sparse"


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in DEFAULT_CASES if fusable(c)], ids=ids)
def test_fused_kernels_agree(case, monkeypatch):
    """fused=True with the 12-element matrix in a compiled kernel (test_faces_agree's fused
    steps take the in-place path, all params being small): about 5 s a kernel, so the
    defaults and the values away from them only."""
    monkeypatch.setattr(inplace, "TINY", 8)
    params = make_params(case.name)
    grads_seq = gradients(case.name, params)
    expected, _ = run_functional(case.algorithm.transform(**case.hyperparams), params, grads_seq)
    for label, (opt, ps) in faces(case, fused=True).items():
        if "fused" in label:
            got = dict(zip(params, run_class(opt, ps, grads_seq)))
            assert_same(got, expected, label, **FUSED)


# Algorithms whose first updates are zero by design, and how many: ADOPT's first step only
# sets its second moment. The step checked is the first that moves.
# first steps that change nothing, by algorithm or case: ADOPT's first sets its second
# moment; timm's AdaBelief without degenerated_to_sgd waits while RAdam's variance is
# intractable (more than the STEPS here)
STILL_FIRST_STEPS = {"Adopt": 1, "AdaBelief-degenerated_to_sgd=False": STEPS}


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_first_step_descends(case):
    """The one property every optimizer shares, so that a sign flipped in all faces at once
    (which they would agree on) fails here too: without weight decay, the first update
    points against the gradient (along it with maximize=True)."""
    params = make_params(case.name)
    no_decay = {"weight_decay": 0.0} if "weight_decay" in case.hyperparams else {}
    hyperparams = {**case.hyperparams, **no_decay}
    tx = case.algorithm.transform(**hyperparams)
    still = STILL_FIRST_STEPS.get(repr(case), STILL_FIRST_STEPS.get(case.name, 0))
    grads_seq, state = gradients(case.name, params), tx.init(params)
    for grads in grads_seq[:still]:
        updates, state = tx.update(grads, state, params)
        assert all(not u.any() for u in updates.values())
    if still >= len(grads_seq):
        return
    grads = grads_seq[still]
    updates, _ = tx.update(grads, state, params)
    slope = sum((u.to_dense() * g.to_dense()).sum() for u, g in zip(updates.values(), grads.values()))
    assert slope > 0 if case.hyperparams.get("maximize") else slope < 0, f"update . gradient = {slope}"


# -- purity and torch.func ----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_update_is_pure(case):
    params = make_params(case.name)
    tx = case.algorithm.transform(**case.hyperparams)
    state = tx.init(params)
    for grads in gradients(case.name, params):
        before = clone_tree((grads, state, params))
        updates, new_state = tx.update(grads, state, params)
        assert_tree_close((grads, state, params), before, **EXACT)
        state, params = new_state, fo.apply_updates(params, updates)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_vmap_equals_separate_runs(case):
    skip_if_sparse(case.name, "vmap")
    params = make_params(case.name, batch=(3,))
    grads_seq = gradients(case.name, params)
    tx = case.algorithm.transform(**case.hyperparams, **FLOAT64_MATH.get(case.name, {}))
    batched = vmap(lambda p, gs: run_functional(tx, p, gs))(params, grads_seq)
    for i in range(3):
        member = optree.tree_map(lambda x, i=i: x[i], (params, grads_seq))
        assert_tree_close(
            optree.tree_map(lambda x, i=i: x[i], batched), run_functional(tx, *member), **ROUND_OFF
        )


def final_loss(case: Case, lr: torch.Tensor, params: dict[str, torch.Tensor], steps: int = 2) -> torch.Tensor:
    """The loss after `steps` functional steps on the loss's own gradients."""
    tx = case.algorithm.transform(**{**case.hyperparams, **FLOAT64_MATH.get(case.name, {}), "lr": lr})
    state = tx.init(params)
    for _ in range(steps):
        updates, state = tx.update(grad(loss)(params), state, params)
        params = fo.apply_updates(params, updates)
    return loss(params)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_grad_through_two_steps(case):
    """d(loss)/d(lr) by torch.func.grad equals central finite differences; d(loss)/d(params)
    by torch.func.grad equals autograd's (backward through the same steps)."""
    skip_if_sparse(case.name, "torch.func.grad")
    params = make_params(case.name)
    lr = torch.tensor(float(case.hyperparams["lr"]) or 0.05, dtype=torch.float64)
    d_lr, d_params = grad(lambda lr, p: final_loss(case, lr, p), argnums=(0, 1))(lr, params)
    h = 1e-6 * lr
    numeric = (final_loss(case, lr + h, params) - final_loss(case, lr - h, params)) / (2 * h)
    torch.testing.assert_close(d_lr, numeric, rtol=1e-5, atol=1e-7)
    leaves = {k: p.clone().requires_grad_() for k, p in params.items()}
    lr_leaf = lr.clone().requires_grad_()
    final_loss(case, lr_leaf, leaves).backward()
    torch.testing.assert_close(d_lr, lr_leaf.grad, **ROUND_OFF)
    assert_same(d_params, {k: p.grad for k, p in leaves.items()}, **ROUND_OFF)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_state_keeps_its_structure(case):
    """The functional state's tree structure, shapes and dtypes at init are those after
    each step (so a compiled update compiles once, and the state can be a scan carry)."""
    params = make_params(case.name)
    tx = case.algorithm.transform(**case.hyperparams)
    state = tx.init(params)
    layout = lambda s: optree.tree_map(lambda x: (x.shape, x.dtype) if isinstance(x, torch.Tensor) else x, s)  # noqa: E731
    for grads in gradients(case.name, params):
        updates, new_state = tx.update(grads, state, params)
        assert optree.tree_structure(new_state) == optree.tree_structure(state)
        assert layout(new_state) == layout(state)
        state, params = new_state, fo.apply_updates(params, updates)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_compiled_update_equals_eager(case):
    """torch.compile(tx.update, fullgraph=True) over 2 steps, with the aot_eager backend
    (Dynamo's graph and AOTAutograd's decompositions: what fullgraph refuses or a trace gets
    wrong shows there; inductor's code generation, minutes over all cases, is test_fused's)."""
    skip_if_sparse(case.name, "torch.compile")
    import torch._dynamo

    torch._dynamo.reset()
    params = make_params(case.name)
    tx = case.algorithm.transform(**case.hyperparams)
    compiled = torch.compile(tx.update, fullgraph=True, backend="aot_eager")
    state = eager_state = tx.init(params)
    for i, grads in enumerate(gradients(case.name, params, steps=2)):
        with torch._dynamo.config.patch(error_on_recompile=i > 0):  # one graph: the state keeps its structure
            updates, state = compiled(grads, state, params)
        expected, eager_state = tx.update(grads, eager_state, params)
        assert_tree_close((updates, state), (expected, eager_state), **ROUND_OFF)
        params = fo.apply_updates(params, expected)


# -- errors -------------------------------------------------------------------------------


def bad_values(bound: Any) -> list[float]:
    """Values each bound refuses: below 0 (0 too where it must be positive), and at or above
    its upper end."""
    values = [-0.5] + ([0.0] if bound.positive else [])
    if bound.high is not None:
        values.append(bound.high + 0.5 if bound.inclusive else bound.high)
    return values


def with_value(kwargs: dict[str, Any], bound: Any, value: float) -> dict[str, Any]:
    if bound.index is None:
        return {**kwargs, bound.key: value}
    pair = list(kwargs[bound.key])
    pair[bound.index] = value
    return {**kwargs, bound.key: tuple(pair)}


BOUND_CASES = [
    pytest.param(
        c, bound, value, id=f"{c.name}-{bound.key}{'' if bound.index is None else bound.index}={value}"
    )
    for c in CASES
    if c.label == "defaults"
    for bound in c.algorithm.bounds
    if isinstance(bound, fo.Bound)  # (a Check's rule has tests of its own)
    for value in bad_values(bound)
]


@pytest.mark.parametrize(("case", "bound", "value"), BOUND_CASES)
def test_bounds_raise_torch_errors(case, bound, value):
    message = f"^{re.escape(bound.message.format(value))}$"
    hyperparams = with_value(case.hyperparams, bound, value)
    with pytest.raises(ValueError, match=message):
        case.algorithm.transform(**hyperparams)
    with pytest.raises(ValueError, match=message):
        fo.Optimizer([torch.zeros(2, 2, requires_grad=True)], case.algorithm, **hyperparams)
    if bound.key not in class_options(case.cls):  # a funcopt extra (eps_root): the factory's only
        return
    kwargs = with_value({**class_options(case.cls), **case.kwargs}, bound, value)
    with pytest.raises(ValueError, match=message) as ours:
        case.cls([torch.zeros(2, 2, requires_grad=True)], **kwargs)
    twin = getattr(torch.optim, case.name, None)
    if twin is not None:  # torch's own message, word for word
        with pytest.raises(ValueError) as theirs:
            twin([torch.zeros(2, 2, requires_grad=True)], **kwargs)
        assert str(ours.value) == str(theirs.value)


# -- checkpoints --------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_state_dict_round_trip(case):
    """state_dict -> a fresh optimizer (another lr: the groups load too) -> the same next
    step; a pickled optimizer too; for the class and for fo.Optimizer over the algorithm."""
    params = make_params(case.name)
    first, last = gradients(case.name, params)[:2], gradients(case.name, params)[2]
    makers = {
        "class": lambda ps, **kw: case.cls(ps, **{**case.kwargs, **kw}),
        "fo.Optimizer": lambda ps, **kw: fo.Optimizer(ps, case.algorithm, **{**case.hyperparams, **kw}),
    }
    for label, make in makers.items():
        ps = as_leaves(params)
        opt = make(ps)
        run_class(opt, ps, first)
        fresh_ps = [torch.nn.Parameter(p.detach().clone()) for p in ps]
        fresh = make(fresh_ps, lr=0.5)
        fresh.load_state_dict(copy.deepcopy(opt.state_dict()))
        unpickled = pickle.loads(pickle.dumps(opt))
        unpickled_ps = unpickled.param_groups[0]["params"]
        for o, qs in ((opt, ps), (fresh, fresh_ps), (unpickled, unpickled_ps)):
            step(o, qs, last)
        assert_same([p.detach() for p in fresh_ps], [p.detach() for p in ps], label, **EXACT)
        assert_same([p.detach() for p in unpickled_ps], [p.detach() for p in ps], label, **EXACT)
        assert_same(fresh.state_dict(), opt.state_dict(), label, **EXACT)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_transformation_and_state_pickle(case):
    params = make_params(case.name)
    grads_seq = gradients(case.name, params)
    tx = case.algorithm.transform(**case.hyperparams)
    _, state = run_functional(tx, params, grads_seq[:2])
    tx2, state2 = pickle.loads(pickle.dumps((tx, state)))
    assert type(state2) is type(state)
    assert b"_src" not in pickle.dumps(state), "a state pickles under a public path (funcopt.AdamState)"
    factory = public_factory(case)
    if factory is not None:  # a transformation pickles as its public factory and arguments
        assert b"_src" not in pickle.dumps(factory)
    assert_tree_close(state2, state, **EXACT)
    expected = tx.update(grads_seq[2], state, params)
    assert_tree_close(tx2.update(grads_seq[2], state2, params), expected, **EXACT)


def test_every_registered_algorithm_is_covered():
    """The cases come from the registry itself: each algorithm with its defaults, values away
    from them, and each boolean option of its class."""
    assert {c.name for c in CASES} >= {name for name, a in REGISTRY.items() if built_in(a)}, (
        "a built-in algorithm without a drop-in class fo.NAME, which gives this suite its defaults"
    )
    assert all(math.isfinite(float(c.hyperparams["lr"])) for c in CASES)
    lion = {c.label for c in CASES if c.name == "Lion"}
    assert lion == {"defaults", "away", "maximize=True"}
