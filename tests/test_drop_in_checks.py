"""Range checks of the drop-in face cover tensor values (issue 62): ``fo.Optimizer``
built from a factory refuses a bad tensor hyperparameter at construction, with torch's
message, as torch's class and funcopt's do; the functional factories, whose tensors may
be traced or batched, check none."""

from __future__ import annotations

import pytest
import torch

import funcopt as fo

BAD = [
    ("lr", float("nan")),
    ("lr", -1.0),
    ("eps", -1e-8),
    ("weight_decay", -0.1),
    ("betas", (1.5, 0.999)),
    ("betas", (0.9, float("nan"))),
]


def torch_message(cls, key, value):
    with pytest.raises(ValueError) as e:
        cls([torch.nn.Parameter(torch.zeros(2))], **{key: value})
    return str(e.value)


def as_tensor(value):
    return tuple(map(torch.tensor, value)) if isinstance(value, tuple) else torch.tensor(value)


@pytest.mark.parametrize("key,value", BAD, ids=[f"{k}={v}" for k, v in BAD])
def test_factory_form_checks_tensor_values_as_torch(key, value):
    tensor = as_tensor(value)
    expected = torch_message(torch.optim.AdamW, key, tensor)
    assert expected == torch_message(fo.AdamW, key, tensor)
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError) as e:
        fo.Optimizer(params, fo.adamw, **{key: tensor})
    assert str(e.value) == expected
    with pytest.raises(ValueError) as e:  # a factory of a chain: the same check inside it
        fo.Optimizer(params, lambda **hp: fo.chain(fo.clip(1.0), fo.adamw(**hp)), **{key: tensor})
    assert str(e.value) == expected
    fo.adamw(**{key: tensor})  # the functional factory reads no tensor's value


def test_tensor_values_in_range_pass_and_step():
    p = torch.nn.Parameter(torch.ones(2))
    opt = fo.Optimizer([p], fo.nadam, lr=torch.tensor(0.1), betas=(torch.tensor(0.9), torch.tensor(0.99)))
    p.grad = torch.ones(2)
    opt.step()
    assert (p < 1).all()


def test_functional_factory_under_vmap_and_compile_reads_no_value():
    """Batched and traced tensor hyperparameters pass unread; so does a factory called in
    a step after construction, outside the check (the lr a scheduler sets, as torch)."""
    params, grads = torch.ones(3), torch.ones(3)

    def step(lr):
        tx = fo.adamw(lr=lr)
        return tx.update(grads, tx.init(params), params)[0]

    lrs = torch.tensor([0.1, -0.1, float("nan")])
    out = torch.func.vmap(step)(lrs)
    assert out[1].gt(0).all() and out[2].isnan().all()
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert compiled(torch.tensor(-0.1)).gt(0).all()
