"""The fast-weight rules of parametric attention, one class per rule: its hyperparameters, the slow weights it adds to
the learner (gates), the state it starts from, its write (a ``cl_lightning.ops`` op) and its read.

A chunk's tokens (:class:`Encoded`) and values are written into a fast state of fixed size per head
(:meth:`FastWeightRule.write`). A rule holds its hyperparameters only: the slow weights it adds live on the learner
(``slow``) under their own names (``gate_proj``, ``a_log``, ...), so checkpoint keys do not depend on how the rule is
given. In a config:
``rule: {class_path: cl_lightning.nn.fast_weights.GatedDeltaRule, init_args: {forget_init: 1.0e-3}}``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from cl_lightning import ops
from cl_lightning.ops.ttt_linear import ttt_linear_read
from cl_lightning.ops.ttt_mlp import mlp_forward

State = Tensor | tuple[Tensor, ...]


class Encoded(NamedTuple):
    """One chunk's tokens: keys = queries ``(1, H, N, K)`` (``(1, H, N, P, K)`` with P pairs), write strengths β
    ``(1, H, N)`` and, where the rule has them, log-gates (forget / retention), log-momentum and window weights γ."""

    keys: Tensor
    beta: Tensor
    log_gate: Tensor | None = None
    log_momentum: Tensor | None = None
    gamma: Tensor | None = None


class FastWeightRule(ABC):
    """A rule: writes a chunk into a fast state and reads a state (by default S ``(H, K, V)``, zeros, read as Sᵀq)."""

    linear_readout: ClassVar[bool] = True  # read as a linear map of the query (several pairs per example allowed)
    learned_init: ClassVar[bool] = False  # the initial state is a slow parameter (TTT), not zeros

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def setup(self, slow: nn.Module, width: int, heads: int, key_dim: int, num_outputs: int) -> None:
        """Register the rule's slow weights on ``slow`` (gate heads on the encoder's features h of ``width``)."""
        return

    def gates(self, slow: nn.Module, h: Tensor) -> dict[str, Tensor]:
        """The rule's gates of a chunk's features h ``(N, width)`` by ``Encoded`` field, each ``(1, H, N)``."""
        return {}

    def initial_state(self, heads: int, key_dim: int, num_outputs: int, generator: torch.Generator) -> dict:
        """The state's tensors by buffer name, ``fast_state`` first (TTT draws its weights from ``generator``)."""
        return {"fast_state": torch.zeros(heads, key_dim, num_outputs)}

    def write(self, slow: nn.Module, enc: Encoded, values: Tensor, state: State, prequential: bool = True):
        """Run the rule from ``state`` (``(H, ...)`` per tensor) on a chunk's tokens and values ``(1, H, N, V)``,
        each token read with q = k before its own write if ``prequential``: outputs ``(1, H, N, V)`` (before any
        readout head) and the final state, of the structure of ``state``. With P pairs per example the chunk is
        written as a P-times longer sequence (:func:`cl_lightning.ops.expand_pairs`)."""
        keys, beta, g, log_mu, gamma = enc
        q, pairs = keys, (keys.shape[3] if keys.dim() == 5 else 1)
        if pairs > 1:  # P pairs per example: a P-times longer sequence, read at each example's first pair
            values = values.unsqueeze(3).expand(-1, -1, -1, pairs, -1)  # every pair carries the example's value
            q, keys, values, beta = ops.expand_pairs(keys, keys, values, _per_pair(beta, pairs))
            g, log_mu, gamma = (None if t is None else _per_pair(t, pairs).flatten(2, 3) for t in (g, log_mu, gamma))
        s0 = tuple(t.unsqueeze(0).to(keys.dtype) for t in as_tuple(state))  # (1, H, ...)
        o, s = self.run(slow, q, Encoded(keys, beta, g, log_mu, gamma), values, s0, prequential)
        if pairs > 1:
            o = ops.pair_outputs(o, pairs)
        return o, as_state(tuple(t.squeeze(0) for t in as_tuple(s)))

    @abstractmethod
    def run(self, slow: nn.Module, q: Tensor, enc: Encoded, v: Tensor, s0: tuple[Tensor, ...], prequential: bool):
        """The rule's op, batch of one: queries, tokens, values ``(1, H, T, ...)``, state ``(1, H, ...)``."""

    def read(self, slow: nn.Module, state: State, queries: Tensor) -> Tensor:
        """Read ``state`` without writing: queries ``(1, H, N, K)``, or ``(1, H, N, P, K)`` read with the mean of the
        P, to outputs ``(1, H, N, V)`` before any readout head."""
        if queries.dim() == 5:
            queries = queries.mean(3)  # linear readout: the mean of the P readings
        return self.read_state(slow, tuple(t.unsqueeze(0).to(queries.dtype) for t in as_tuple(state)), queries)

    def read_state(self, slow: nn.Module, s: tuple[Tensor, ...], queries: Tensor) -> Tensor:
        """Sᵀq from a state ``(1, H, ...)`` per tensor."""
        return queries @ s[0]

    def output_layer(self, slow: nn.Module) -> nn.Module | None:
        """The last trained layer on the read-out path if the rule adds one (else the key projection is)."""
        return None


class ChunkedRule(FastWeightRule):
    """A rule whose op runs in chunks of matrix products: ``op(q, k, v, beta=β, g=log α, initial_state=S_0)``.

    Args:
        chunk_size: Tokens per chunk C of the op's chunked form (not the stream's chunk; no number depends on it).
    """

    def __init__(self, *, chunk_size: int = 64) -> None:
        if chunk_size < 1:
            raise ValueError("need chunk_size >= 1")
        self.chunk_size = chunk_size

    @staticmethod
    @abstractmethod
    def op(*args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """The rule's chunked op from ``cl_lightning.ops``."""

    def run(self, slow, q, enc, v, s0, prequential):
        gate = {} if enc.log_gate is None else {"g": enc.log_gate}  # the forget-gated rules' log α
        chunk = {"prequential": prequential, "chunk_size": self.chunk_size}
        return self.op(q, enc.keys, v, beta=enc.beta, initial_state=s0[0], **gate, **chunk)


class LinearAttention(ChunkedRule):
    """Linear attention (Hebbian) with write strength β: S ← S + β k vᵀ (re-writing a key adds to its value)."""

    op = staticmethod(ops.chunk_linear_attn)


class DeltaRule(ChunkedRule):
    """The delta rule: S ← (I − β k kᵀ) S + β k vᵀ, one LMS step on ½‖Sᵀk − v‖².

    A re-written key's value is replaced, not added to; chunked through the WY/UT representation."""

    op = staticmethod(ops.chunk_delta_rule)


class Longhorn(ChunkedRule):
    """Longhorn (Liu et al. 2024): S[i] ← (1 − ε k_i²) S[i] + ε k_i vᵀ per key row i, ε = β / (1 + β‖k‖²).

    The reference code's diagonal form of Longhorn's implicit (proximal) online-regression step."""

    op = staticmethod(ops.chunk_longhorn)


class OmegaRule(ChunkedRule):
    """The Omega rule (ATLAS): a gradient step per token on the loss of the last c tokens.

    S ← S + (β / c) Σ_{i in window} γ_i k_i (v_i − Sᵀk_i)ᵀ, each token weighted by a learned γ = sigmoid(w_γᵀ h); the
    step β / c keeps the total write per token from growing with c.

    Args:
        window: The window c of tokens whose loss each write descends.
    """

    op = staticmethod(ops.chunk_omega_rule)

    def __init__(self, *, window: int = 4, **kwargs: Any) -> None:
        if window < 1:
            raise ValueError("need window >= 1")
        super().__init__(**kwargs)
        self.window = window

    def setup(self, slow, width, heads, key_dim, num_outputs):
        slow.gamma_proj = gate_head(width, heads)  # γ ≈ sigmoid(0) = 0.5 at the start

    def gates(self, slow, h):
        return {"gamma": slow.gamma_proj(h).sigmoid().T.unsqueeze(0)}

    def run(self, slow, q, enc, v, s0, prequential):
        beta = enc.beta / self.window
        return self.op(q, enc.keys, v, beta, enc.gamma, self.window, s0[0], prequential, self.chunk_size)


class ForgetGate(FastWeightRule):
    """A learned forget (retention) gate per token and head: log α = −exp(A_log) · softplus(w_αᵀ h + dt_bias).

    Gated DeltaNet's parameterisation, A_log starting at 0.

    Args:
        forget_init: Initial −log α ≈ softplus(dt_bias) (1e-3: α ≈ 0.999 per token).
    """

    def __init__(self, *, forget_init: float = 1e-3, **kwargs: Any) -> None:
        if forget_init <= 0:
            raise ValueError("need forget_init > 0")
        super().__init__(**kwargs)
        self.forget_init = forget_init

    def setup(self, slow, width, heads, key_dim, num_outputs):
        slow.gate_proj = gate_head(width, heads)
        slow.a_log = nn.Parameter(torch.zeros(heads))
        dt_bias = self.forget_init + math.log(-math.expm1(-self.forget_init))  # inverse softplus (fla's dt_bias init)
        slow.dt_bias = nn.Parameter(torch.full((heads,), dt_bias))

    def gates(self, slow, h):
        log_gate = -slow.a_log.exp() * nn.functional.softplus(slow.gate_proj(h) + slow.dt_bias)  # log α <= 0
        return {"log_gate": log_gate.T.unsqueeze(0)}


class DecayLinearAttention(ForgetGate, ChunkedRule):
    """Linear attention with a forget gate per token and head: S ← α S + β k vᵀ."""

    op = staticmethod(ops.chunk_decay_linear_attn)


class GatedDeltaRule(ForgetGate, ChunkedRule):
    """The gated delta rule (Gated DeltaNet): S ← α (I − β k kᵀ) S + β k vᵀ, LMS plus weight decay 1 − α."""

    op = staticmethod(ops.chunk_gated_delta_rule)


class Titans(ForgetGate):
    """Titans' linear memory: M ← μ M + β k (v − S₀ᵀk)ᵀ, S ← α S + M.

    Momentum μ (a learned gate) on the surprise (the gradient of ½‖Sᵀk − v‖² at S₀, the memory at the mini-batch's
    start), retention α as weight decay; the state is S and M, ``(H, K, V)`` each.

    Args:
        forget_init: Initial −log α of the retention gate.
        momentum_init: Initial momentum μ = sigmoid(w_μᵀ h + b_μ), in (0, 1).
        mini_batch_size: Tokens per gradient mini-batch (1: exact per-token gradients).
    """

    def __init__(self, *, momentum_init: float = 0.9, mini_batch_size: int = 16, **kwargs: Any) -> None:
        if mini_batch_size < 1 or not 0 < momentum_init < 1:
            raise ValueError("need mini_batch_size >= 1 and momentum_init in (0, 1)")
        super().__init__(**kwargs)
        self.momentum_init, self.mini_batch_size = momentum_init, mini_batch_size

    def setup(self, slow, width, heads, key_dim, num_outputs):
        super().setup(slow, width, heads, key_dim, num_outputs)
        slow.momentum_proj = gate_head(width, heads)
        slow.momentum_bias = nn.Parameter(torch.full((heads,), math.log(self.momentum_init / (1 - self.momentum_init))))

    def gates(self, slow, h):
        log_mu = nn.functional.logsigmoid(slow.momentum_proj(h) + slow.momentum_bias)
        return {**super().gates(slow, h), "log_momentum": log_mu.T.unsqueeze(0)}

    def initial_state(self, heads, key_dim, num_outputs, generator):
        zeros = torch.zeros(heads, key_dim, num_outputs)
        return {"fast_state": zeros, "fast_momentum": zeros}

    def run(self, slow, q, enc, v, s0, prequential):
        mini = self.mini_batch_size
        return ops.chunk_titans_linear(q, enc.keys, v, enc.beta, enc.log_momentum, enc.log_gate, s0, prequential, mini)


class TTTRule(FastWeightRule):
    """A TTT rule (Sun et al. 2024): a non-linear fast model trained by mini-batch gradient descent.

    From a learned initial state, at the per-token rate (base_lr / d_k) β, every gradient of a mini-batch taken at
    its start, with TTT's position scale 1/i inside a mini-batch (the mean gradient at its end), as TTT's code.

    Args:
        mini_batch_size: Tokens per gradient mini-batch.
        base_lr: eta_base of the per-token rate.
    """

    linear_readout = False
    learned_init = True

    def __init__(self, *, mini_batch_size: int = 16, base_lr: float = 1.0) -> None:
        if mini_batch_size < 1:
            raise ValueError("need mini_batch_size >= 1")
        self.mini_batch_size, self.base_lr = mini_batch_size, base_lr

    def rate(self, enc: Encoded) -> Tensor:  # η = (eta_base / d_k) β
        return enc.beta * self.base_lr / enc.keys.shape[-1]


class TTTLinear(TTTRule):
    """TTT-Linear: the fast model f(q) = q + LN(qW + b), trained on ½‖LN(kW + b) − (Ev − k)‖².

    Values are embedded to d_k by a learned map E (no bias), the residual branch read out as its inner products with
    the columns of E; W ~ N(0, 0.02²) ``(H, K, K)``, b = 0."""

    def setup(self, slow, width, heads, key_dim, num_outputs):
        slow.value_embed = nn.Linear(num_outputs, key_dim, bias=False)  # E, then the fast model's inner LayerNorm
        slow.ln_weight = nn.Parameter(torch.ones(heads, key_dim))
        slow.ln_bias = nn.Parameter(torch.zeros(heads, key_dim))

    def initial_state(self, heads, key_dim, num_outputs, generator):
        w = 0.02 * torch.randn(heads, key_dim, key_dim, generator=generator)
        return {"fast_state": w, "fast_bias": torch.zeros(heads, key_dim)}

    def run(self, slow, q, enc, v, s0, prequential):
        embed, ln, mini = slow.value_embed, (slow.ln_weight, slow.ln_bias), self.mini_batch_size
        o, s = ops.chunk_ttt_linear(q, enc.keys, embed(v), self.rate(enc), *ln, s0, prequential, mini)
        return (o - q) @ embed.weight, s  # the residual branch read against each value's embedding

    def read_state(self, slow, s, queries):
        o = ttt_linear_read(queries, s[0], s[1], slow.ln_weight.unsqueeze(1), slow.ln_bias.unsqueeze(1))
        return (o - queries) @ slow.value_embed.weight

    def output_layer(self, slow):
        return slow.value_embed


class TTTMLP(TTTRule):
    """TTT-MLP: a two-layer fast weight f(k) = gelu(k W1 + b1) W2 + b2, trained on ½‖f(k) − v‖².

    W1 ~ N(0, 1) ``(H, K, D_h)`` (unit keys give unit-variance pre-activations), b1, W2 ``(H, D_h, V)`` and b2 zero.

    Args:
        hidden: The hidden width D_h; None means d_k.
    """

    def __init__(self, *, hidden: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden = hidden

    def initial_state(self, heads, key_dim, num_outputs, generator):
        d_h, zeros = self.hidden or key_dim, torch.zeros
        w1 = torch.randn(heads, key_dim, d_h, generator=generator)
        return {"fast_state": w1, "fast_b1": zeros(heads, d_h), "fast_w2": zeros(heads, d_h, num_outputs),
                "fast_b2": zeros(heads, num_outputs)}  # fmt: skip

    def run(self, slow, q, enc, v, s0, prequential):
        tau = 1.0 / torch.arange(1, self.mini_batch_size + 1, dtype=q.dtype, device=q.device)
        return ops.chunk_ttt_mlp(q, enc.keys, v, self.rate(enc), s0, prequential, self.mini_batch_size, tau)

    def read_state(self, slow, s, queries):
        return mlp_forward(queries, s)


def as_tuple(state: State) -> tuple[Tensor, ...]:
    """A state's tensors as a tuple (one for a single-tensor state)."""
    return (state,) if isinstance(state, Tensor) else tuple(state)


def as_state(tensors: tuple[Tensor, ...]) -> State:
    """The inverse of :func:`as_tuple`: a single tensor for a one-tensor state, else the tuple."""
    return tensors[0] if len(tensors) == 1 else tensors


def gate_head(width: int, heads: int) -> nn.Linear:
    """A gate's head on h, one output per head, near zero at the start (the rules' gates and the learner's β)."""
    head = nn.Linear(width, heads)
    nn.init.normal_(head.weight, std=1e-3)
    nn.init.zeros_(head.bias)
    return head


def _per_pair(t: Tensor, pairs: int) -> Tensor:
    """A per-example gate ``(1, H, N)`` repeated for each of its pairs: ``(1, H, N, P)``."""
    return t.unsqueeze(3).expand(*t.shape[:3], pairs)
