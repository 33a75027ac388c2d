"""Implicit differentiation of solvers (jaxopt's convention): decorate
``solver(init_params, *theta) -> params`` with `custom_root` or
`custom_fixed_point`, and the solution is differentiable in theta by the implicit
function theorem, under ``.backward()``, ``torch.autograd.grad`` and ``torch.func``."""

from ._src.implicit import custom_fixed_point, custom_root

__all__ = ["custom_fixed_point", "custom_root"]
