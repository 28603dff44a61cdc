"""What autograd keeps for each activation a Hugging Face config can name (``hidden_act``,
``activation_function``, ``hidden_activation``): every key of ``ACT2CLS`` in transformers 5.24
``src/transformers/activations.py``, read from the class's ``forward`` as PyTorch 2.11 differentiates it
(``tools/autograd/derivatives.yaml``).

Rules of the reading, each from ``derivatives.yaml``: a product of two tensors that both need a gradient
(``mul.Tensor``) keeps both; a product with, a sum with or a division by a Python number keeps no tensor;
``pow.Tensor_Scalar``, ``erf``, ``softplus``, ``clamp`` (``torch.clip``), ``hardtanh`` (``relu6``),
``gelu``, ``silu``, ``mish``, ``hardswish`` and ``leaky_relu`` keep their input; ``tanh``, ``sigmoid``,
``relu``, ``sqrt`` and ``expm1`` keep their result. The activation's own output is kept by its consumer (the
down projection, or the gate's product with ``up``) in every case, so what is listed here is what the
activation keeps beside it: its input, and the intermediates its Python expression materialises. Each
intermediate is as wide as the MLP and in the activation's dtype.

A config naming an activation with parameters of its own (``prelu``: ``nn.PReLU``'s one-element weight;
``xielu``: ``XIELUActivation``'s ``alpha_p`` / ``alpha_n``) is read as the same expression: the parameters
(one or two elements per layer) are not counted; what the expression computes from them and keeps is.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS_PY = "transformers 5.24 src/transformers/activations.py"


@dataclass(frozen=True, slots=True)
class Activation:
    """What one activation keeps for its backward, beside its output."""

    keeps_input: bool
    intermediates: tuple[str, ...] = ()  # MLP-wide tensors of the activation's dtype the expression keeps
    masks: tuple[str, ...] = ()  # MLP-wide bool tensors it keeps (``torch.where``'s condition)
    scalars: tuple[str, ...] = ()  # one-element tensors of the activation's dtype it computes and keeps
    identity: bool = False  # the output is the input (``LinearActivation``): no op, nothing new
    source: str = ""

    @property
    def plain(self) -> bool:
        """Keeps exactly its input (as ``F.gelu`` and ``F.silu`` do): the fused rules already say so."""
        return self.keeps_input and not (self.intermediates or self.masks or self.scalars or self.identity)


def _tanh_gelu(cls: str) -> Activation:
    return Activation(True, ("tanh", "half_x", "one_plus_tanh"),
                      source=f"{ACTIVATIONS_PY} {cls}.forward: 0.5 * x * (1 + tanh(c * (x + 0.044715 * pow(x, 3)))) "
                             "— PowBackward0 keeps x, TanhBackward0 its result, the last MulBackward0 0.5·x and "
                             "(1 + tanh)")


#: every ``ACT2CLS`` key -> what its forward keeps (transformers 5.24; the same classes since 4.40)
HF_ACTIVATIONS: dict[str, Activation] = {
    "gelu": Activation(True, source=f"{ACTIVATIONS_PY} GELUActivation: F.gelu — GeluBackward0 keeps its input"),
    "gelu_10": Activation(True, ("gelu",), source=f"{ACTIVATIONS_PY} ClippedGELUActivation: torch.clip(gelu(x), "
                                                  "-10, 10) — GeluBackward0 keeps x, ClampBackward1 gelu(x)"),
    "gelu_fast": Activation(True, ("c_x", "scaled_x", "inner", "tanh", "half_x", "one_plus_tanh"),
                            source=f"{ACTIVATIONS_PY} FastGELUActivation: 0.5 * x * (1 + tanh(x * 0.7978845608 * "
                                   "(1 + 0.044715 * x * x))) — (0.044715·x)·x keeps both, (x·0.798)·(1 + …) both, "
                                   "tanh its result, the last product 0.5·x and (1 + tanh)"),
    "gelu_new": _tanh_gelu("NewGELUActivation"),
    "gelu_python": Activation(False, ("scaled_x", "half_x", "one_plus_erf"),
                              source=f"{ACTIVATIONS_PY} GELUActivation._gelu_python: x * 0.5 * (1 + erf(x / sqrt 2)) "
                                     "— ErfBackward0 keeps x / sqrt 2, the last MulBackward0 0.5·x and (1 + erf)"),
    "gelu_pytorch_tanh": Activation(True, source=f"{ACTIVATIONS_PY} GELUTanh: F.gelu(approximate='tanh') — "
                                                 "GeluBackward0 keeps its input"),
    "gelu_python_tanh": _tanh_gelu("GELUTanh._gelu_tanh_python"),
    "gelu_accurate": _tanh_gelu("AccurateGELUActivation"),
    "hardswish": Activation(True, source=f"{ACTIVATIONS_PY} nn.Hardswish — HardswishBackward0 keeps its input"),
    "laplace": Activation(False, ("scaled_x",),
                          source=f"{ACTIVATIONS_PY} LaplaceActivation: 0.5 * (1 + erf((x - mu) / (sigma·sqrt 2))) "
                                 "— ErfBackward0 keeps the scaled input"),
    "leaky_relu": Activation(True, source=f"{ACTIVATIONS_PY} nn.LeakyReLU — LeakyReluBackward0 keeps its input"),
    "linear": Activation(False, identity=True, source=f"{ACTIVATIONS_PY} LinearActivation returns its input"),
    "mish": Activation(True, source=f"{ACTIVATIONS_PY} MishActivation: F.mish — MishBackward0 keeps its input"),
    "quick_gelu": Activation(True, ("sigmoid",),
                             source=f"{ACTIVATIONS_PY} QuickGELUActivation: x * sigmoid(1.702 * x) — "
                                    "SigmoidBackward0 keeps its result, MulBackward0 x and the sigmoid"),
    "relu": Activation(False, source=f"{ACTIVATIONS_PY} nn.ReLU — ReluBackward0 keeps its result (the output)"),
    "relu2": Activation(False, ("relu",),
                        source=f"{ACTIVATIONS_PY} ReLUSquaredActivation: square(relu(x)) — ReluBackward0 and "
                               "PowBackward0 keep relu(x)"),
    "relu6": Activation(True, source=f"{ACTIVATIONS_PY} nn.ReLU6: hardtanh(x, 0, 6) — HardtanhBackward0 keeps its "
                                     "input"),
    "sigmoid": Activation(False, source=f"{ACTIVATIONS_PY} nn.Sigmoid — SigmoidBackward0 keeps its result"),
    "silu": Activation(True, source=f"{ACTIVATIONS_PY} SiLUActivation: F.silu — SiluBackward0 keeps its input"),
    "sqrtsoftplus": Activation(True, source=f"{ACTIVATIONS_PY} SqrtSoftplusActivation: softplus(x).sqrt() — "
                                            "SoftplusBackward0 keeps x, SqrtBackward0 its result (the output)"),
    "swish": Activation(True, source=f"{ACTIVATIONS_PY} nn.SiLU — SiluBackward0 keeps its input"),
    "tanh": Activation(False, source=f"{ACTIVATIONS_PY} nn.Tanh — TanhBackward0 keeps its result"),
    "prelu": Activation(True, source=f"{ACTIVATIONS_PY} nn.PReLU — PreluKernelBackward0 keeps its input (and the "
                                     "one-element weight)"),
    "xielu": Activation(True, ("alpha_p_x", "expm1", "expm1_minus_x"), masks=("positive",),
                        scalars=("alpha_p", "alpha_n"),
                        source=f"{ACTIVATIONS_PY} XIELUActivation._xielu_python: where(x > 0, alpha_p·x·x + beta·x, "
                               "(expm1(min(x, eps)) - x)·alpha_n + beta·x) — alpha_p·x and x kept by their product, "
                               "MinimumBackward0 x, ExpM1Backward0 its result, (expm1 - x) by ·alpha_n, WhereBackward0 "
                               "the bool condition; alpha_p = softplus(alpha_p) and alpha_n = beta + softplus(alpha_n) are kept by "
                               "their products"),
}
