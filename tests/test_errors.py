"""Bad input raises torch.optim's exceptions, in the adapters and in the factories."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import re

import optree
import pytest
import torch
from helpers import (
    ALGORITHMS,
    HYPER,
    INFOS,
    algorithm,
    assert_same,
    factory,
    fo_cls,
    full_state,
    kwargs_of,
    make,
    matrices_for,
    matrices_only,
    needs_params,
    skip_if_closure_required,
    skip_unless_steps_on_gradients,
    skip_unsupported,
    torch_cls,
    trainable,
    weight_decay,
)
from torch.overrides import TorchFunctionMode
from torch.testing._internal.common_optimizers import OptimizerErrorEnum

import funcopt as fo

ERROR_CASES = [
    (name, i, e)
    for name in ALGORITHMS
    for i, e in enumerate(INFOS[name].optim_error_inputs_func("cpu", torch.float32))
]


@pytest.mark.parametrize(
    "name,i,error_input", ERROR_CASES, ids=[f"{n}-{e.optimizer_error_input.desc}" for n, _, e in ERROR_CASES]
)
def test_torch_error_inputs(name, i, error_input):
    """Every entry of torch's ``optim_error_inputs_func`` raises torch's type and message."""
    optim_input = error_input.optimizer_error_input
    cls = fo_cls(name)
    if error_input.error_on == OptimizerErrorEnum.CONSTRUCTION_ERROR:
        if issubclass(error_input.error_type, Warning):
            with pytest.warns(error_input.error_type, match=error_input.error_regex):
                cls(optim_input.params, **optim_input.kwargs)
        else:
            with pytest.raises(error_input.error_type, match=error_input.error_regex):
                cls(optim_input.params, **optim_input.kwargs)
    else:
        opt = cls(optim_input.params, **optim_input.kwargs)
        with pytest.raises(error_input.error_type, match=error_input.error_regex):
            opt.step()


def _numeric_args(name):
    sig = inspect.signature(torch_cls(name).__init__)
    return {
        k: p.default
        for k, p in sig.parameters.items()
        if isinstance(p.default, (int, float, tuple)) and not isinstance(p.default, bool)
    }


def _bad_values(default):
    values = [-0.5, 1.0, 1.5, math.nan, math.inf]
    if isinstance(default, tuple):
        return [
            tuple(v if j == i else d for j, d in enumerate(default))
            for i in range(len(default))
            for v in values
        ]
    return values


def _outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the exception itself is what is compared
        return type(e), str(e)
    return None


BAD_CASES = [
    (name, key, value)
    for name in ALGORITHMS
    for key, default in _numeric_args(name).items()
    for value in _bad_values(default)
]


@pytest.mark.parametrize("name,key,value", BAD_CASES, ids=[f"{n}-{k}={v}" for n, k, v in BAD_CASES])
def test_out_of_range_hyperparameter(name, key, value):
    """Out-of-range values: the same exception (type and message) as torch, or none if
    torch accepts the value; the functional factory raises the same for Python numbers."""
    params = [torch.nn.Parameter(torch.randn(2, 2) if matrices_only(name) else torch.randn(2))]
    expected = _outcome(lambda: torch_cls(name)(params, **{key: value}))
    assert _outcome(lambda: fo_cls(name)(params, **{key: value})) == expected
    assert _outcome(lambda: factory(name)(**{key: value})) == expected


@pytest.mark.parametrize(
    "betas", [(0.9, 0.99, 0.9), (0.9,), 0.9, torch.tensor(0.9), torch.tensor([0.9, 0.99, 0.9]), "09"]
)
@pytest.mark.parametrize("name", ["Adamax", "NAdam"])
def test_betas_that_are_not_a_pair(name, betas):
    """torch accepts them and fails at the first step with an unpacking or index error;
    funcopt says what is wrong when the optimizer is made."""
    params = [torch.nn.Parameter(torch.randn(2))]
    for build in (lambda: fo_cls(name)(params, betas=betas), lambda: factory(name)(betas=betas)):
        with pytest.raises(ValueError, match="betas must be a pair of numbers or 0-d tensors, or a tensor"):
            build()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_functional_skips_range_checks_on_tensors(name):
    """A tensor hyperparameter may be batched or traced: it is never read in Python."""
    factory(name)(lr=torch.tensor(-1.0))  # no error
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        factory(name)(lr=torch.tensor([0.1, 0.2]))


@pytest.mark.parametrize("name", ["Adadelta", "Adamax", "NAdam"])
def test_sparse_gradients_rejected(name):
    """Before any param changes: here a large param (stepped in blocks) comes first."""
    dense = torch.nn.Parameter(torch.randn(200, 200))
    dense.grad = torch.randn_like(dense)
    p = torch.nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4).to_sparse()
    before = dense.detach().clone()
    for cls in (torch_cls(name), fo_cls(name)):
        with pytest.raises(RuntimeError, match=f"{name} does not support sparse gradients"):
            cls([dense, p]).step()
        assert torch.equal(dense, before)
    tx = factory(name)()
    with pytest.raises(RuntimeError, match=f"{name} does not support sparse gradients"):
        tx.update([p.grad], tx.init([p.detach()]), [p.detach()])


def test_adagrad_sparse_with_weight_decay_rejected():
    """torch's error; funcopt raises it before any param changes (torch steps the params
    before the sparse one first)."""
    dense = torch.nn.Parameter(torch.randn(200, 200))
    dense.grad = torch.randn_like(dense)
    p = torch.nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4).to_sparse()
    msg = "weight_decay option is not compatible with sparse gradients"
    with pytest.raises(RuntimeError, match=msg):
        torch.optim.Adagrad([p], weight_decay=0.1).step()
    before = dense.detach().clone()
    with pytest.raises(RuntimeError, match=msg):
        fo_cls("Adagrad")([dense, p], weight_decay=0.1).step()
    assert torch.equal(dense, before)
    tx = factory("Adagrad")(weight_decay=0.1)
    with pytest.raises(RuntimeError, match=msg):
        tx.update([p.grad], tx.init([p.detach()]), [p.detach()])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"fused": True, "differentiable": True}, "`fused` does not support `differentiable`"),
        ({"fused": True, "foreach": True}, "`fused` and `foreach` cannot be `True` together"),
    ],
)
def test_adagrad_fused_conflicts(kwargs, message):
    for cls in (torch.optim.Adagrad, fo_cls("Adagrad")):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            cls([torch.nn.Parameter(torch.randn(2))], **kwargs)


def test_adagrad_fused_needs_floating_point():
    p = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))
    p.grad = torch.randn_like(p)
    for cls in (torch.optim.Adagrad, fo_cls("Adagrad")):
        with pytest.raises(RuntimeError):
            cls([p], fused=True).step()


def test_update_without_params_needs_no_weight_decay():
    params = {"w": torch.randn(3)}
    grads = {"w": torch.randn(3)}
    tx = factory("NAdam")()
    tx.update(grads, tx.init(params))  # fine without weight decay
    tx = factory("NAdam")(weight_decay=0.1)
    with pytest.raises(ValueError, match="needs the params"):
        tx.update(grads, tx.init(params))


def test_update_with_wrong_state():
    params = {"w": torch.randn(3)}
    with pytest.raises(TypeError, match="NAdamState"):
        factory("NAdam")().update(params, factory("Adamax")().init(params), params)


def _test_values(name):
    """`name`'s test hyperparameters (SGD's with momentum: a state with buffers), without
    weight decay (so an update may omit the params, and a differentiable step's state
    does not record the params): zero where the default is not (Muon's 0.1)."""
    return {**{k: v for k, v in HYPER[name].items() if k != "weight_decay"}, **weight_decay(name, 0.0)}


def _with_buffers(name):
    return make(name, _test_values(name))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_with_mismatched_shapes(name):
    """A gradient or a state that would broadcast against its param raises, instead of
    silently giving the update, the state and then the param another shape. Buffers not
    shaped like their param (Adafactor's) are checked by the algorithm, which names them
    and the shapes it expects."""
    skip_if_closure_required(name)
    skip_unsupported(name, vectors=True)
    params = {"a": torch.randn(3), "b": torch.randn(2)}
    tx = _with_buffers(name)
    state = full_state(tx, params)
    with pytest.raises(ValueError, match=r"leaf 0 differ \(gradient \(1,\), param \(3,\)"):
        tx.update({"a": torch.randn(1), "b": torch.randn(2)}, state, params)
    match = r"leaf 0 differ \(gradient \(1,\), param \(1,\), \w+ \(3,\)"
    if not algorithm(name).buffers_like_param:
        match = r"gradient of shape \(1,\) needs .*\(1,\) but the state has .*\(3,\).*a state that init made"
    with pytest.raises(ValueError, match=match):
        small = {"a": torch.randn(1), "b": torch.randn(1)}
        tx.update(small, state, small)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_with_mismatched_dtypes(name):
    """A gradient of another dtype than its param raises an error naming the leaf and the
    dtypes, rather than one from inside the math that names no tensor."""
    skip_if_closure_required(name)
    shape = (1,) if matrices_only(name) else ()  # Muon's params are matrices
    params = {"a": torch.randn(3, *shape), "b": torch.randn(2, *shape)}
    tx = _with_buffers(name)
    grads = {"a": torch.randn(3, *shape), "b": torch.randn(2, *shape, dtype=torch.float64)}
    with pytest.raises(
        ValueError, match=r"dtypes of leaf 1 differ \(gradient float64, param float32, \w+ float32"
    ):
        tx.update(grads, full_state(tx, params), params)
    if needs_params(name):  # an update without the params is refused (test_functional)
        return
    with pytest.raises(ValueError, match=r"dtypes of leaf 1 differ \(gradient float64, \w+ float32"):
        tx.update(grads, full_state(tx, params))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_with_tensors_on_different_devices(name):
    """A gradient, or a state buffer, on another device than its param raises an error
    naming the leaf and the devices (torch's own names no tensor); the meta device
    stands in for a GPU, where it can (`_raises_naming_devices`)."""
    skip_if_closure_required(name)
    shape = (1,) if matrices_only(name) else ()  # Muon's params are matrices
    params = {"a": torch.randn(3, *shape), "b": torch.randn(2, *shape)}
    tx = _with_buffers(name)
    state = full_state(tx, params)
    grads = {"a": torch.randn(3, *shape), "b": torch.randn(2, *shape, device="meta")}
    _raises_naming_devices(
        lambda: tx.update(grads, state, params),
        r"leaf 1 are on different devices \(gradient meta, param cpu, \w+ cpu",
    )
    # a buffer, not a counter (nor an entry the param has not: Adafactor's row_var of a vector)
    k = next(j for j, field in enumerate(state) if torch.is_tensor(field["a"]) and field["a"].dim() > 0)
    buffer = state[k]
    moved = state._replace(**{state._fields[k]: {"a": buffer["a"].to("meta"), "b": buffer["b"]}})
    _raises_naming_devices(
        lambda: tx.update({"a": torch.randn(3, *shape), "b": torch.randn(2, *shape)}, moved, params),
        rf"leaf 0 are on different devices \(.*{state._fields[k]} meta",
    )


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):  # a TensorList too, which optree takes for a leaf
        return [t for y in x for t in _tensors(y)]
    return [t for y in x.values() for t in _tensors(y)] if isinstance(x, dict) else []


class _MetaIntoHost(TorchFunctionMode):
    """Records the in-place ops that write into a CPU tensor from a meta one, which torch
    skips silently (``x.add_(meta)``, ``torch._foreach_add_``, ``_foreach_copy_``): from a
    GPU tensor such an op raises, or copies."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = getattr(func, "__name__", "")
        written, read = _tensors(args[:1]), _tensors([args[1:], kwargs])
        in_place = op.endswith("_") and not op.endswith("__")
        if in_place and any(not t.is_meta for t in written) and any(t.is_meta for t in read):
            self.ops.append(op)
        return func(*args, **kwargs)


def _raises_naming_devices(update, match):
    """`update()` raises a ValueError that matches `match`; the test skips where it did not
    raise because torch silently skipped an op that reads the meta tensor (SGD's and
    ASGD's steps add the gradient in place; the eager path copies a buffer into fresh
    memory): there the meta device is no stand-in for a GPU."""
    spy = _MetaIntoHost()
    try:
        with spy:
            update()
    except ValueError as error:
        assert re.search(match, str(error)), f"{error!r} does not match {match!r}"
        return
    if spy.ops:
        pytest.skip(
            f"the meta device is no stand-in here: this step meets torch's {spy.ops[0]}, which silently "
            "skips a meta tensor written into a CPU one (a GPU tensor raises or is copied), before "
            "any op that raises"
        )
    pytest.fail(f"DID NOT RAISE a ValueError matching {match!r}")


@dataclasses.dataclass
class Box:  # a container of the user's that optree does not flatten
    w: torch.Tensor


@pytest.mark.parametrize("name", ALGORITHMS)
def test_leaves_that_are_not_tensors(name):
    tx = factory(name)()
    with pytest.raises(
        TypeError, match=rf"^{name} init: leaf 1 of params is a float; params must be a pytree of tensors"
    ):
        tx.init({"a": torch.randn(3), "b": [1.0]})
    with pytest.raises(TypeError, match=rf"^{name} init: leaf 0 of params is an int; params must be"):
        tx.init([1])
    model = torch.nn.Linear(2, 1)
    for given, kind in ((model, "Linear"), (model.parameters(), "generator")):
        with pytest.raises(
            TypeError,
            match=rf"^{name} init: leaf 0 of params is a {kind}; params must be a pytree of tensors: "
            r"for a module's, a dict or list of them, such as \{name: p\.detach\(\) for name, p in "
            r"model\.named_parameters\(\)\}$",
        ):
            tx.init(given)
    with pytest.raises(  # a container class optree does not flatten (without a namespace) is a leaf
        TypeError,
        match=rf"^{name} init: leaf 0 of params is a Box; params must be a pytree of tensors, and its "
        r"containers are those optree flattens without a namespace \(dict, list, tuple, NamedTuple, "
        r"OrderedDict, \.\.\.\): pass this object's tensors in a dict$",
    ):
        tx.init(Box(torch.randn(3)))
    skip_if_closure_required(name)  # (its init is checked above)
    params = {"a": torch.randn(3, 2), "b": torch.randn(2, 2)}  # matrices: Muon's init takes no other
    with pytest.raises(TypeError, match=rf"^{name} update: the gradient of leaf 0 is a float; grads must be"):
        tx.update({"a": 0.5, "b": torch.randn(2, 2)}, tx.init(params), params)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_integer_params(name):
    """An integer leaf (a model's state_dict has some) is refused at init, rather than
    given an integer state that fails inside the first update."""
    params = {"w": torch.randn(3, 2), "num_batches_tracked": torch.tensor(0)}  # a matrix, for Muon
    with pytest.raises(TypeError, match=rf"^{name} init: leaf 0 of params is a tensor of dtype int64, "):
        factory(name)().init(params)  # leaves in key order: num_batches_tracked first
    factory(name)().init({**params, "num_batches_tracked": None})


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("value", ["0.1", None, [0.1]])
def test_hyperparameter_of_another_type(name, value):
    """A hyperparameter that is neither a number nor a tensor raises a TypeError that
    names it, in the factory and in the class (torch's fails comparing it, naming none)."""
    message = rf"^lr must be a number or a 0-d tensor; got {re.escape(repr(value))}$"
    with pytest.raises(TypeError, match=message):
        factory(name)(lr=value)
    with pytest.raises(TypeError, match=message):
        fo_cls(name)([torch.nn.Parameter(torch.randn(2))], lr=value)
    with pytest.raises(TypeError):
        torch_cls(name)([torch.nn.Parameter(torch.randn(2))], lr=value)


def test_beta_of_another_type():
    with pytest.raises(TypeError, match=r"^betas\[1\] must be a number or a 0-d tensor; got None$"):
        factory("NAdam")(betas=(0.9, None))


@pytest.mark.parametrize(
    "combinator",
    [
        lambda tx: fo.chain(fo.clip_by_global_norm(1.0), tx),
        lambda tx: fo.masked(tx, lambda p: p),
        lambda tx: fo.partition({"all": tx}, lambda p: "all"),
        lambda tx: fo.inner_loop(lambda p: p.sum(), torch.ones(2), tx, []),
    ],
    ids=["chain", "masked", "partition", "inner_loop"],
)
def test_transformation_arguments_are_checked(combinator):
    """A factory passed uncalled, a class or another object, where a transformation
    belongs, raises at once and says what to pass, not at the first init or update."""
    with pytest.raises(TypeError, match=r"got the function adamax: call it, adamax\(...\), to get one$"):
        combinator(fo.adamax)
    with pytest.raises(TypeError, match=r"got the class Adamax: pass a transformation"):
        combinator(fo.Adamax)
    with pytest.raises(
        TypeError,
        match=r": expected a GradientTransformation \(with init and update\), got an object of type int$",
    ):
        combinator(3)
    combinator(fo.adamax())  # a transformation is fine


def test_optimizer_transform_is_checked():
    """fo.Optimizer refuses what is not a transformation or its factory (a class, a
    number, a transformation whose update is not a function), and a factory that returns
    something else, naming what it got."""
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    with pytest.raises(TypeError, match="but got the class Adamax: pass a factory such as fo.adamax"):
        fo.Optimizer([p], fo.Adamax, lr=0.1)
    with pytest.raises(TypeError, match="GradientTransformation"):
        fo.Optimizer([p], 3)
    with pytest.raises(
        TypeError, match="^fo.Optimizer: expected a .*, got one whose update is a NoneType, not a"
    ):
        fo.Optimizer([p], fo.GradientTransformation(fo.adamax().init, None))
    with pytest.raises(TypeError, match="^fo.Optimizer, from the transform function: expected a Gradient"):
        fo.Optimizer([p], lambda lr: lr, lr=0.1)  # built at construction, so it fails there


def test_optimizer_explains_a_labels_tree_by_param_names():
    """fo.Optimizer gives the transformation a group's params keyed by position, so
    partition labels by param names cannot fit: the structure error goes on to say why
    and what to pass instead, and no param changes. Other errors pass unchanged."""
    model = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]

    def by_names(lr):
        return fo.partition({"a": fo.adamax(lr=lr), "b": fo.nadam(lr=lr)}, {"weight": "a", "bias": "b"})

    opt = fo.Optimizer(model.named_parameters(), by_names, lr=0.01)
    model(torch.ones(4, 3)).sum().backward()
    with pytest.raises(
        ValueError,
        match=r"^partition init: the labels tree does not .*lacks key\(s\) \['0'\].* \(fo\.Optimizer "
        r"gives the transformation a param group's params as a dict keyed by position, .* give "
        r"masked and partition a function of the tensors, for example by p\.ndim\.\)$",
    ):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))

    def failing_init(params):
        raise ValueError("boom")

    opt = fo.Optimizer(model.parameters(), fo.GradientTransformation(failing_init, fo.adamax().update))
    with pytest.raises(ValueError, match="^boom$"):
        opt.step()


# (params, grads) -> (grads, the params init gets, params), with one tree that differs;
# then what the error says
STRUCTURE_CASES = {
    "a loss for grads": (
        lambda p, g: (torch.tensor(1.0), p, p),
        r"state\.step does not .* \(it has a dict where a leaf belongs\)",
    ),
    "grads of other params": (
        lambda p, g: ({"a": g["a"], "c": g["b"]}, p, p),
        r"state\.step does not .*\(state\.step lacks key\(s\) \['c'\] that grads has; grads lacks key\(s\) \['b'\]",
    ),
    "grads as a list": (lambda p, g: (list(g.values()), p, p), r"state\.step does not .*instance of list"),
    "params as a list": (
        lambda p, g: (g, p, list(p.values())),
        r"params does not have the structure of grads",
    ),
    "a state of other params": (lambda p, g: (g, [p["a"]], p), r"state\.step does not have the structure"),
    "grads as a tuple, params in a list": (
        lambda p, g: (tuple(g.values()), list(p.values()), list(p.values())),
        r"state\.step does not .*instance of tuple.* One is a list and the other a tuple \(torch\.autograd"
        r"\.grad returns a tuple\): pass both as the same kind, for example list\(grads\)\.$",
    ),
}


@pytest.mark.parametrize("case", STRUCTURE_CASES)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_with_mismatched_structures(name, case):
    """grads, state and params whose structures differ raise an error that names the
    tree that differs and says what to pass, not an error from deep inside the step."""
    skip_if_closure_required(name)
    params = matrices_for(name, {"a": torch.randn(3), "b": torch.randn(2)})  # Muon's init takes matrices
    mismatch, match = STRUCTURE_CASES[case]
    grads, init_params, params = mismatch(
        params, matrices_for(name, {"a": torch.randn(3), "b": torch.randn(2)})
    )
    tx = factory(name)()
    state = tx.init(init_params)
    match = match.replace(r"state\.step", rf"state\.{state._fields[0]}")  # the first field differs first
    with pytest.raises(ValueError, match=rf"^{name} update: {match}") as error:
        tx.update(grads, state, params)
    assert "structure of the params given to init" in str(error.value)
    assert ("torch.autograd.grad" in str(error.value)) == ("tuple" in case)


def test_update_and_apply_take_any_kind_of_dict():
    """An OrderedDict (``model.state_dict()``) and a dict of the same keys match."""
    from collections import OrderedDict

    params = OrderedDict(a=torch.randn(3), b=torch.randn(2))
    tx = fo.adamax()
    updates, _ = tx.update({"b": torch.ones(2), "a": torch.ones(3)}, tx.init(params), params)
    new = fo.apply_updates(params, updates)
    assert type(updates) is dict and type(new) is OrderedDict
    torch.testing.assert_close(new["a"], params["a"] - 2e-3)


def test_key_mismatch_says_which_tree_lacks_which_keys():
    """optree says both sides from the second tree's (a state with an "extra key" where
    the grads lack one): the message says which tree lacks which keys (issue 62)."""
    params = {"a": torch.zeros(2), "b": torch.zeros(2)}
    tx = fo.adam()
    state = tx.init(params)
    with pytest.raises(
        ValueError, match=r"\(grads lacks key\(s\) \['b'\] that state\.step has\)\. grads, params"
    ) as e:
        tx.update({"a": torch.zeros(2)}, state, params)
    assert "extra" not in str(e.value)
    with pytest.raises(
        ValueError,
        match=r"\(state\.step lacks key\(s\) \['c'\] that grads has; grads lacks key\(s\) \['b'\] that state\.step has\)",
    ):
        tx.update({"a": torch.zeros(2), "c": torch.zeros(2)}, state, params)


def test_apply_updates_with_mismatched_structure():
    params = {"a": torch.randn(3), "b": torch.randn(2)}
    with pytest.raises(
        ValueError,
        match=r"^apply_updates: updates does not .* \(updates lacks key\(s\) \['b'\] that params has\)\. Pass",
    ):
        fo.apply_updates(params, {"a": torch.randn(3)})
    with pytest.raises(
        ValueError, match=r"updates does not have the structure of params \(Expected an instance of dict"
    ):
        fo.apply_updates(params, torch.randn(3))
    with pytest.raises(ValueError, match=r"One is a list and the other a tuple \(torch\.autograd\.grad"):
        fo.apply_updates(list(params.values()), (torch.randn(3), torch.randn(2)))


@pytest.mark.parametrize("shape", [(3, 2), (), (1,)])
def test_apply_updates_with_mismatched_shape(shape):
    """An update of another shape would broadcast (the param taking its shape, or one
    value added to all its elements): refused, params untouched."""
    params = {"a": torch.randn(3), "b": torch.randn(2)}
    before = {k: v.clone() for k, v in params.items()}
    with pytest.raises(
        ValueError, match=rf"^apply_updates: the update of leaf 1 has shape {re.escape(str(shape))}"
    ):
        fo.apply_updates(params, {"a": torch.ones(3), "b": torch.ones(shape)})
    assert all(torch.equal(params[k], before[k]) for k in params)


def test_optimizer_refuses_hyperparameters_a_built_transformation_never_reads():
    """With a transformation already built, an lr given to fo.Optimizer would sit in the
    param groups, and a scheduler would change it, with no effect on the steps: refused.
    torch's switches, which the adapter reads, are fine."""
    params = [torch.nn.Parameter(torch.randn(2))]
    with pytest.raises(
        TypeError,
        match=r"^fo\.Optimizer got hyperparameters \(lr, betas\) with a transformation already built, "
        r"which never reads them: pass a function that builds it from them instead, such as fo\.nadam",
    ):
        fo.Optimizer(params, fo.nadam(lr=0.1), lr=0.01, betas=(0.9, 0.99))
    opt = fo.Optimizer(params, fo.nadam(lr=0.1), differentiable=False, foreach=None)
    assert opt.param_groups[0]["differentiable"] is False


def test_optimizer_checks_a_factorys_hyperparameters_at_construction():
    """A factory is called once at construction, so a misspelled or out-of-range
    hyperparameter fails there, as torch's classes fail, not at the first step."""
    params = [torch.nn.Parameter(torch.randn(2))]
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'lrr'"):
        fo.Optimizer(params, fo.nadam, lrr=0.1)
    with pytest.raises(ValueError, match=r"^Invalid learning rate: -1\.0$"):
        fo.Optimizer(params, lambda lr: fo.chain(fo.clip_by_global_norm(1.0), fo.nadam(lr=lr)), lr=-1.0)


def test_inner_loop_refuses_a_batch_that_is_a_tensor():
    """(x, y) for [(x, y)]: each tensor would be a batch, its rows unpacked as the loss's
    arguments, which could even run on the wrong data (two rows, two arguments)."""
    x, y = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(TypeError, match=r"^inner_loop: each batch .* not \(x, y\)$"):
        fo.inner_loop(lambda p, a, b: (p * a - b).pow(2).sum(), torch.ones(3), fo.adamax(), (x, y))
    fo.inner_loop(lambda p, a, b: (p * a - b).pow(2).sum(), torch.ones(3), fo.adamax(), [(x, y)])


def _stepped_optimizer(name, path, shapes=((200, 200), (5,))):
    """An optimizer over a large param (stepped in blocks) and a small one, after one
    step, on the path that `path` names."""
    skip_if_closure_required(name)
    sparse = INFOS[name].only_supports_sparse_grads
    if path == "differentiable" and "differentiable" not in inspect.signature(torch_cls(name)).parameters:
        pytest.skip(f"{name} has no differentiable step, as torch's")
    if path == "chain" and sparse:
        pytest.skip(f"{name} takes sparse gradients only, which clip_by_global_norm does not")
    skip_unsupported(name, vectors=True)
    params = trainable([torch.randn(s) for s in shapes], path == "differentiable")
    for p in params:
        p.grad = torch.randn_like(p).to_sparse() if sparse else torch.randn_like(p)
    hp = kwargs_of(_test_values(name))  # SGD with momentum: a state with buffers
    if path == "chain":
        opt = fo.Optimizer(params, fo.chain(fo.clip_by_global_norm(1.0), factory(name)(**hp)))
    else:
        flags = {"differentiable": True} if path == "differentiable" else {}
        opt = fo_cls(name)(params, **flags, **hp)
    opt.step()
    return opt, params


def _snapshot(opt, params):
    """Copies of the params and of the state's values (detached: a differentiable step's
    state may record the params, as ASGD's ax does, as torch's)."""
    state = optree.tree_map(lambda v: v.detach() if torch.is_tensor(v) else v, opt.state_dict()["state"])
    return [p.detach().clone() for p in params], copy.deepcopy(state)


PATHS = ["in place", "differentiable", "chain"]


def _optional_keys(name):
    """The state keys a param's state may lack, for the default hyperparameters."""
    opt = fo_cls(name)([torch.zeros(1, requires_grad=True)])
    return opt._transform.optional(opt.defaults)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_state_without_an_entry(name, path):
    """A param's state that lacks an entry (edited by hand) raises a KeyError that
    says so at the step, before any param or state changes."""
    opt, params = _stepped_optimizer(name, path)
    state = opt.state[params[1]]
    # an entry the step needs: not one that torch creates only at a first step (SGD's
    # momentum_buffer, which a step then creates anew, as torch's does)
    required = [
        k
        for k in state
        if "step" not in k and k.split(".")[-1] not in ("count", *_optional_keys(name))  # (counters)
    ]
    if not required:
        pytest.skip(f"{name}'s state has no entry that a step needs besides its counters")
    del state[required[0]]
    before = _snapshot(opt, params)
    with pytest.raises(KeyError, match="no entry .* another optimizer"):
        opt.step()
    assert_same(_snapshot(opt, params), before)


@pytest.mark.parametrize("stale_grad", [False, True])
@pytest.mark.parametrize("path", PATHS[:2])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_param_resized_after_a_step(name, path, stale_grad):
    """A param replaced after a step by one of another shape (``p.data = ...``) raises
    at the next step, naming the shapes, before any param or state changes; clearing its
    state starts it afresh. torch's step fails on broadcasting after changing some
    state; funcopt's stepped silently where the size stayed the same ((5,) to (1, 5),
    (200, 200) to (400, 100))."""
    opt, params = _stepped_optimizer(name, path)
    as_grad = torch.Tensor.to_sparse if INFOS[name].only_supports_sparse_grads else torch.Tensor.clone
    for p, shape in zip(params, [(400, 100), (1, 5)]):
        p.data = torch.randn(shape)
        if not stale_grad:
            p.grad = as_grad(torch.randn(shape))
    before = _snapshot(opt, params)
    match = (
        r"a param of shape \(400, 100\) has (a gradient of shape \(200, 200\), )?\w+ of shape \(200, 200\)"
        r".*`del optimizer.state\[param\]`"
    )
    if not algorithm(name).buffers_like_param:  # checked by the algorithm (Adafactor's row_var)
        match = (
            r"a param of shape \(400, 100\) has a gradient of shape \(200, 200\)"
            if stale_grad
            else r"a gradient of shape \(400, 100\) needs .* \(200, 1\).*`del optimizer.state\[param\]`"
        )
    with pytest.raises(ValueError, match=match):
        opt.step()
    assert_same(_snapshot(opt, params), before)
    for p in params:
        del opt.state[p]
        p.grad = as_grad(torch.randn_like(p))
    opt.step()
    for p in params:
        buffers = [t for t in opt.state[p].values() if torch.is_tensor(t) and t.dim()]
        assert buffers and all(t.shape == p.shape or not algorithm(name).buffers_like_param for t in buffers)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_model_converted_after_a_step(name):
    """A model converted to float64 after a step (``model.double()``) steps as torch's
    class does. Adadelta and Adagrad step with their float32 state, bitwise as torch.
    Adamax and NAdam fail, as torch's do (where torch's error names neither the tensor
    nor the cause), with an error that says why and what to do, and change nothing.
    Loading the optimizer's own state_dict casts the state, and both then step alike."""
    skip_unless_steps_on_gradients(name)

    def run(lib, attempt=True):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2, bias=not matrices_only(name))  # Muon steps no bias
        params = list(model.parameters())
        opt = getattr(lib, name)(params, lr=0.1)
        gen = torch.Generator().manual_seed(1)

        def backward():
            opt.zero_grad()
            model(torch.randn(4, 3, generator=gen, dtype=params[0].dtype)).sum().backward()

        backward()
        opt.step()
        model.double()
        backward()
        before, error = _snapshot(opt, params), None
        if attempt:
            try:
                opt.step()
            except RuntimeError as e:
                error = e
        after = _snapshot(opt, params)
        opt.load_state_dict(opt.state_dict())
        backward()
        opt.step()
        return error, before, after, _snapshot(opt, params)

    error, before, after, end = run(fo)
    torch_error, _, torch_after, _ = run(torch.optim)
    assert (error is None) == (torch_error is None)
    if error is None:
        assert_same(after, torch_after, rtol=0, atol=0)
        assert_same(end, run(torch.optim)[3], rtol=0, atol=0)
    else:
        assert re.search(
            f"{name} step: a param of dtype float64 has \\w+(, \\w+)* of dtype float32: the model was "
            "converted after .* optimizer.load_state_dict\\(optimizer.state_dict\\(\\)\\)",
            str(error),
        )
        assert_same(after, before, rtol=0, atol=0)
        assert_same(end, run(torch.optim, attempt=False)[3], rtol=0, atol=0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_params_converted_after_a_differentiable_step(name):
    """The pure step (``differentiable``, compiled) takes one dtype: a param converted
    after its state was made gets the same error for all four algorithms, before any
    param or state changes."""
    opt, params = _stepped_optimizer(name, "differentiable")
    for p in params:
        p.data = p.data.double()
        p.grad = torch.randn_like(p)
    before = _snapshot(opt, params)
    with pytest.raises(RuntimeError, match=f"{name} step: a param of dtype float64 has .* of dtype float32"):
        opt.step()
    assert_same(_snapshot(opt, params), before, rtol=0, atol=0)


OTHER = {name: "Adadelta" if name == "Adagrad" else "Adagrad" for name in ALGORITHMS}


@pytest.mark.parametrize("source", ["another optimizer", "other params"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_load_state_that_does_not_fit(name, path, source):
    """load_state_dict refuses a state saved by another optimizer (an entry is missing)
    or for other params (a buffer's shape differs), and leaves the optimizer as it was.
    torch loads both; its next step fails after changing the params before the bad one."""
    opt, params = _stepped_optimizer(name, path)
    if path == "chain" and source == "other params" and _optional_keys(name):
        pytest.skip("a chain's state does not say the shape of a buffer absent at first")
    if source == "another optimizer":
        if all(k.split(".")[-1] in _optional_keys(name) for k in opt.state[params[0]] if "step" not in k):
            pytest.skip(f"{name} steps from any state, as torch's (its keys may be absent)")
        other = torch_cls(OTHER[name])([torch.nn.Parameter(p.detach().clone()) for p in params])
        for p in other.param_groups[0]["params"]:
            p.grad = torch.randn_like(p)
        other.step()
        match = "no entry .* saved by another optimizer"
    else:
        other, _ = _stepped_optimizer(name, path, shapes=((5,), (200, 200)))
        match = "has shape \\(5,\\) but its param has shape \\(200, 200\\)"
        if not algorithm(name).buffers_like_param:  # Adafactor: a matrix has other entries than a vector
            match = "loaded state of a param of shape \\(200, 200\\) has no entry"
    before = _snapshot(opt, params)
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(other.state_dict())
    assert_same(_snapshot(opt, params), before)
    opt.step()  # still usable


@pytest.mark.parametrize("name", ALGORITHMS)
def test_load_state_dict_of_something_else(name, tmp_path):
    """load_state_dict given something other than an optimizer's state_dict says what to
    pass, and changes nothing: torch's class fails on ``.copy()`` of a path or of a
    functional state, and with a bare KeyError on a model's state_dict or a checkpoint."""
    opt, params = _stepped_optimizer(name, PATHS[0])
    model = torch.nn.Linear(2, 1)
    functional = factory(name)().init([p.detach() for p in params])
    cases = [
        (str(tmp_path / "optimizer.pt"), TypeError, "got the path .*optimizer.pt.*torch.load\\(path\\)"),
        (functional, TypeError, f"got an? {name}State: write a functional state .*load_functional_state.*"),
        (3, TypeError, "state_dict\\(\\) returns, but got an int$"),
        (model.state_dict(), KeyError, "no 'param_groups' entry.*'weight', 'bias'.*model's state_dict"),
        ({"optimizer": opt.state_dict()}, KeyError, "no 'param_groups' entry.*'optimizer'.*whole checkpoint"),
        ({"param_groups": opt.state_dict()["param_groups"]}, KeyError, "no 'state' entry"),
    ]
    before = _snapshot(opt, params)
    for given, error, match in cases:
        with pytest.raises(error, match=match):
            opt.load_state_dict(given)
        assert_same(_snapshot(opt, params), before)
    opt.load_state_dict(opt.state_dict())  # what it takes still loads
