"""What ``torch.optim``'s Adam and AdamW allocate inside one ``step()`` beyond their states, on CUDA.

Where the caller leaves ``foreach`` and ``fused`` unset, ``torch/optim/adam.py: adam`` takes the
foreach implementation on CUDA tensors (``_default_to_fused_or_foreach(params, differentiable,
use_fused=False)``: "we want to give the fused impl bake-in time before making it the default"; read
at PyTorch 2.0.1, 2.1.0, 2.11.0 and 2.13.0). ``_multi_tensor_adam`` runs once per parameter
group and loops over the group's tensors grouped by device and dtype
(``Optimizer._group_tensors_by_device_and_dtype``). Everything it does to the parameters, gradients
and moments is in place (``_foreach_lerp_``, ``_foreach_mul_``, ``_foreach_addcmul_``, AdamW's
decoupled decay ``_foreach_mul_(device_params, 1 - lr * weight_decay)``) except the denominator:

- from PyTorch 2.1.0 (pytorch/pytorch#104780 and #104898, "Minimize intermediates to save peak memory"):
  ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`` — a new tensor per parameter, in the
  second moment's dtype, all live at once — then ``_foreach_div_``, ``_foreach_add_(…, eps)`` and
  ``_foreach_addcdiv_`` into the parameters; dropped when the function returns
  (``capturable=False``, no amsgrad: ``torch/optim/adamw.py: _multi_tensor_adamw`` at 2.1.0,
  ``torch/optim/adam.py: _multi_tensor_adam`` at 2.9.1, 2.10.0, 2.11.0 and 2.13.0, where ``AdamW`` is
  ``Adam(decoupled_weight_decay=True)``);
- before 2.1.0 the eps was added out of place: ``denom = torch._foreach_add(exp_avg_sq_sqrt, eps)``, a
  second copy made after the first and live beside it until the return
  (``torch/optim/adamw.py: _multi_tensor_adamw`` at 2.0.1).

Not modelled: ``maximize`` (a negated copy of the gradients), ``amsgrad`` (a third state),
``capturable`` (per-step scalars on the device), torch's non-decoupled ``Adam`` with weight decay (a
copy of the gradients, dropped before the sqrt) and ``fused=True`` (``_fused_adam``: one kernel, no
intermediates). A parameter group whose tensors span several devices or dtypes is taken as one group
(the previous group's intermediates would still be live while the next one's are made).
"""

from __future__ import annotations

from collections.abc import Sequence

from timeline.spec.engine_versions import parse_version

#: the first PyTorch release whose foreach Adam adds eps in place (one intermediate, not two)
EPS_IN_PLACE = (2, 1, 0)


def foreach_temporaries(params: Sequence[tuple[str, int]], moment_bytes: int,
                        pytorch: str) -> tuple[tuple[str, int], ...]:
    """(name, bytes) of the tensors one ``_multi_tensor_adam`` call makes over one parameter group of
    (name, elements), in the order it makes them; all are live together until the call returns."""
    version = parse_version(pytorch) or EPS_IN_PLACE
    out = tuple((f"{name}.exp_avg_sq_sqrt", numel * moment_bytes) for name, numel in params)
    if version < EPS_IN_PLACE:
        out += tuple((f"{name}.denom", numel * moment_bytes) for name, numel in params)
    return out
