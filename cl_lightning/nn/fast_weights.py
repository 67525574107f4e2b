"""The fast-weight mechanism of parametric attention: which ``cl_lightning.ops`` rule writes a fast state, how a state
is read without a write, and the state a rule starts from.

A chunk of N tokens — keys = queries ``(1, H, N, K)``, write strengths β ``(1, H, N)``, the rule's gates (``Encoded``)
and values ``(1, H, N, V)`` — is written into a fast state of fixed size per head, each token read with q = k before
its own write when prequential (read after it otherwise). The rules:

- ``"linear_attn"`` (Hebbian, with write strength β), ``"decay"`` (scalar-gate linear attention), ``"delta_rule"``,
  ``"gated_delta_rule"``, ``"longhorn"`` (the reference code's diagonal form): a state S ``(H, K, V)`` read as Sᵀq;
- ``"omega"``: the loss over the last ``window`` tokens, with step η = β / c (so the total write per token does not
  grow with the window c);
- ``"titans"``: momentum on the surprise, retention gate as weight decay; S and its momentum, ``(H, K, V)`` each;
- ``"ttt_linear"`` (TTT-Linear): values embedded to d_k by a learned map E, the output's residual branch read out as
  its inner products with the columns of E; fast weights W ``(H, K, K)`` and b ``(H, K)``;
- ``"ttt_mlp"``: a two-layer MLP fast weight of width D_h: W1 ``(H, K, D_h)``, b1 ``(H, D_h)``, W2 ``(H, D_h, V)``,
  b2 ``(H, V)``.

The TTT rules' per-token rate is (eta_base / d_k) β with TTT's position scale 1/i inside a mini-batch (the mean
gradient at the mini-batch's end), as TTT's code. With P key–value pairs per example (``kv_pairs``, linear-readout
rules only) the chunk is written as a P-times longer sequence, every pair carrying its example's value and gates, and
each example is read at its first pair with the mean of its P queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

from cl_lightning.ops import (
    chunk_decay_linear_attn,
    chunk_delta_rule,
    chunk_gated_delta_rule,
    chunk_linear_attn,
    chunk_longhorn,
    chunk_omega_rule,
    chunk_titans_linear,
    chunk_ttt_linear,
    chunk_ttt_mlp,
    expand_pairs,
    pair_outputs,
)
from cl_lightning.ops.ttt_linear import ttt_linear_read
from cl_lightning.ops.ttt_mlp import mlp_forward

RuleName = Literal[
    "linear_attn",
    "decay",
    "delta_rule",
    "gated_delta_rule",
    "longhorn",
    "omega",
    "titans",
    "ttt_linear",
    "ttt_mlp",
]
GATED_RULES = ("decay", "gated_delta_rule", "titans")  # the rules with a forget (retention) gate
TTT_RULES = ("ttt_linear", "ttt_mlp")  # the rules read through a non-linear model, from a learned initial state
State = Tensor | tuple[Tensor, ...]


class Encoded(NamedTuple):
    """One chunk's tokens: keys = queries ``(1, H, N, K)`` (``(1, H, N, P, K)`` with P pairs), write strengths β
    ``(1, H, N)`` and, where the rule has them, log-gates (forget / retention), log-momentum and window weights γ."""

    keys: Tensor
    beta: Tensor
    log_gate: Tensor | None = None
    log_momentum: Tensor | None = None
    gamma: Tensor | None = None


class TTTLinearWeights(NamedTuple):
    """TTT-Linear's slow weights: the value embedding E (``V -> K``, no bias) and its LayerNorm's weight and bias
    ``(H, K)``."""

    value_embed: nn.Linear
    ln_weight: Tensor
    ln_bias: Tensor


@dataclass(frozen=True, eq=False)
class FastWeightRule:
    """A rule with its hyperparameters: writes a chunk into a state, reads a state.

    Attributes:
        name: The rule.
        key_dim: d_k, the rows of the state (the TTT rules' rate is divided by it).
        kv_pairs: Key–value pairs P per example (1 for the TTT rules).
        chunk_size: Tokens per chunk of the ops' chunked forms.
        window: The Omega rule's window c.
        mini_batch_size: Tokens per gradient mini-batch of ``"titans"``, ``"ttt_linear"``, ``"ttt_mlp"``.
        ttt_base_lr: eta_base of the TTT rules.
        ttt_linear: TTT-Linear's slow weights (required by ``"ttt_linear"``, unused otherwise).
    """

    name: RuleName
    key_dim: int
    kv_pairs: int = 1
    chunk_size: int = 64
    window: int = 4
    mini_batch_size: int = 16
    ttt_base_lr: float = 1.0
    ttt_linear: TTTLinearWeights | None = None

    def write(self, enc: Encoded, values: Tensor, state: State, prequential: bool = True) -> tuple[Tensor, State]:
        """Run the rule from ``state`` on a chunk.

        Args:
            enc: The chunk's tokens (keys = queries, β, the rule's gates).
            values: Values ``(1, H, N, V)``.
            state: The state to start from, ``(H, ...)`` per tensor (one tensor, or a tuple for multi-tensor rules).
            prequential: Read each token before its own write (else after it).

        Returns:
            The outputs ``(1, H, N, V)`` (read with q = k, before any readout head) and the final state (the same
            structure as ``state``).
        """
        keys, beta, g, log_mu, gamma = enc
        pairs = self.kv_pairs
        if pairs > 1:  # P pairs per example: a P-times longer sequence, read at each example's first pair
            values = values.unsqueeze(3).expand(-1, -1, -1, pairs, -1)  # every pair carries the example's value
            q, keys, values, beta = expand_pairs(keys, keys, values, _per_pair(beta, pairs))
            g, log_mu, gamma = (None if t is None else _per_pair(t, pairs).flatten(2, 3) for t in (g, log_mu, gamma))
        else:
            q = keys
        s0 = tuple(t.unsqueeze(0).to(keys.dtype) for t in as_tuple(state))  # (1, H, ...)
        o, s = self._run(q, Encoded(keys, beta, g, log_mu, gamma), values, s0, prequential)
        if pairs > 1:
            o = pair_outputs(o, pairs)
        return o, as_state(tuple(t.squeeze(0) for t in as_tuple(s)))

    def _run(
        self, q: Tensor, enc: Encoded, v: Tensor, s0: tuple[Tensor, ...], prequential: bool
    ) -> tuple[Tensor, State]:
        """The rule's chunked op, batch of one: queries, tokens, values ``(1, H, T, ...)``, state ``(1, H, ...)``."""
        k, beta, g, log_mu, gamma = enc
        common = {"prequential": prequential}
        chunk = {"chunk_size": self.chunk_size, **common}
        mini = {"mini_batch_size": self.mini_batch_size, **common}
        if self.name == "linear_attn":
            return chunk_linear_attn(q, k, v, beta, initial_state=s0[0], **chunk)
        if self.name == "decay":
            return chunk_decay_linear_attn(q, k, v, g, beta, initial_state=s0[0], **chunk)
        if self.name == "delta_rule":
            return chunk_delta_rule(q, k, v, beta, initial_state=s0[0], **chunk)
        if self.name == "gated_delta_rule":
            return chunk_gated_delta_rule(q, k, v, beta, g, initial_state=s0[0], **chunk)
        if self.name == "longhorn":
            return chunk_longhorn(q, k, v, beta, initial_state=s0[0], **chunk)
        if self.name == "omega":
            return chunk_omega_rule(q, k, v, beta / self.window, gamma, self.window, s0[0], **chunk)
        if self.name == "titans":
            return chunk_titans_linear(q, k, v, beta, log_mu, g, initial_state=s0, **mini)
        eta = beta * self.ttt_base_lr / self.key_dim  # TTT's eta = (eta_base / d) sigmoid(.), tau_i = 1/i
        if self.name == "ttt_linear":
            embed, ln_weight, ln_bias = self._ttt_weights()
            v_emb = embed(v)  # (1, H, T, K)
            o, s = chunk_ttt_linear(q, k, v_emb, eta, ln_weight, ln_bias, initial_state=s0, **mini)
            return (o - q) @ embed.weight, s  # the residual branch read against each value's embedding
        tau = 1.0 / torch.arange(1, self.mini_batch_size + 1, dtype=k.dtype, device=k.device)
        return chunk_ttt_mlp(q, k, v, eta, initial_state=s0, position_scale=tau, **mini)

    def read(self, state: State, queries: Tensor) -> Tensor:
        """Read ``state`` without writing.

        Args:
            state: The state, ``(H, ...)`` per tensor.
            queries: ``(1, H, N, K)``, or ``(1, H, N, P, K)`` with P pairs (read with their mean).

        Returns:
            The outputs ``(1, H, N, V)``, before any readout head.
        """
        if queries.dim() == 5:
            queries = queries.mean(3)  # linear readout: the mean of the P readings
        s = tuple(t.unsqueeze(0).to(queries.dtype) for t in as_tuple(state))
        if self.name == "ttt_linear":
            embed, ln_weight, ln_bias = self._ttt_weights()
            o = ttt_linear_read(queries, s[0], s[1], ln_weight.unsqueeze(1), ln_bias.unsqueeze(1))
            return (o - queries) @ embed.weight
        if self.name == "ttt_mlp":
            return mlp_forward(queries, s)
        return queries @ s[0]

    def _ttt_weights(self) -> TTTLinearWeights:
        if self.ttt_linear is None:
            raise ValueError("rule 'ttt_linear' needs its slow weights (ttt_linear)")
        return self.ttt_linear


def initial_state(
    rule: RuleName, heads: int, key_dim: int, num_outputs: int, mlp_hidden: int, generator: torch.Generator
) -> dict[str, Tensor]:
    """The state a rule starts from, by buffer name (``fast_state`` first).

    Zeros (S, and Titans' momentum, ``(H, K, V)``), or TTT's initial fast weights: TTT-Linear W ~ N(0, 0.02²)
    ``(H, K, K)`` and b = 0; TTT-MLP W1 ~ N(0, 1) ``(H, K, D_h)`` (unit keys give unit-variance pre-activations), b1, W2
    and b2 zero. Only the TTT rules draw from ``generator``.

    Args:
        rule: The rule.
        heads: Heads H, one state each.
        key_dim: d_k (K).
        num_outputs: d_v (V).
        mlp_hidden: The ``"ttt_mlp"`` memory's hidden width D_h (unused by the other rules).
        generator: The source of the TTT rules' random initial weights.

    Returns:
        The state's tensors by name, in registration order.
    """
    if rule == "ttt_linear":
        return {
            "fast_state": 0.02 * torch.randn(heads, key_dim, key_dim, generator=generator),
            "fast_bias": torch.zeros(heads, key_dim),
        }
    if rule == "ttt_mlp":
        return {
            "fast_state": torch.randn(heads, key_dim, mlp_hidden, generator=generator),
            "fast_b1": torch.zeros(heads, mlp_hidden),
            "fast_w2": torch.zeros(heads, mlp_hidden, num_outputs),
            "fast_b2": torch.zeros(heads, num_outputs),
        }
    zeros = torch.zeros(heads, key_dim, num_outputs)
    return {"fast_state": zeros, "fast_momentum": zeros} if rule == "titans" else {"fast_state": zeros}


def as_tuple(state: State) -> tuple[Tensor, ...]:
    """A state's tensors as a tuple (one for a single-tensor state)."""
    return (state,) if isinstance(state, Tensor) else tuple(state)


def as_state(tensors: tuple[Tensor, ...]) -> State:
    """The inverse of :func:`as_tuple`: a single tensor for a one-tensor state, else the tuple."""
    return tensors[0] if len(tensors) == 1 else tensors


def _per_pair(t: Tensor, pairs: int) -> Tensor:
    """A per-example gate ``(1, H, N)`` repeated for each of its pairs: ``(1, H, N, P)``."""
    return t.unsqueeze(3).expand(*t.shape[:3], pairs)
