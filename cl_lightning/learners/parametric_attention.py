"""Parametric attention: a fixed-size fast-weight memory written online (parametric-attention.md §6, a proposal).

McDermott, Heath Jr., Parhi (2026), "Lifelong In-Context Learning with Transformers Requires Parametric Forms of
Attention", arXiv:2606.25342: replace the growing key-value cache by a state of constant size trained at test time
by online regression. A slow encoder h_θ (trained online by Adam) gives, per example (x, y),

    k = q = l2n(W_k h_θ(x)),   v = onehot(y) (classification) or y (regression),
    β = sigmoid(w_βᵀ h + b_β),   log α = −exp(A_log) · softplus(w_αᵀ h + dt_bias)     (GDN gate parameterisation)

and the fast state S ∈ R^{d_k × d_v} (per head) is written by a rule from ``cl_lightning.ops``, e.g. the delta rule
S ← (I − β k kᵀ) S + β k vᵀ or the gated delta rule S ← α (I − β k kᵀ) S + β k vᵀ. Readout: logits = τ · Sᵀq
(τ learnable; regression reads Sᵀq), averaged over heads.

Protocols (§6.4 and §6.3):

- ``"lifelong"`` (default): one persistent S, never reset, no replay buffer, no task ids. Each arrival chunk is
  processed predict-then-write (prequential): example i is predicted from S and the chunk's examples before i, never
  from its own label; those predictions give the loss and the online metric. The chunk starts from the detached
  state (gradients truncated at chunk starts) and the state after the chunk is written back.
- ``"support_set"``: every chunk is an episode written predict-then-write into a *fresh* S (no carry-over); ``S``
  keeps the last chunk's state.

Evaluation (θ and S frozen, no writes to S), both readings of DESIGN §4:

- ``predict_episode`` = **recontext**: write the episode's context into a fresh S, then read the queries (QOA's
  definition of forward/backward, logged as ``eval/forward_acc``, ``eval/backward_acc``, ``eval/acc_matrix/*``);
- **live**: read the queries from the live S, the context unused (logged as ``eval/forward_live_acc``,
  ``eval/backward_live_acc``, ``eval/live_acc_matrix/*``). Without a context (``forward``), the live reading.

Under DDP each rank keeps its own S, written with its share of each chunk.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from cl_lightning.data.stream import StreamBatch
from cl_lightning.learners.base import ContinualLearner, TaskType, adam_1e4
from cl_lightning.nn.cnn import make_encoder
from cl_lightning.nn.mlp import MLP
from cl_lightning.ops import (
    chunk_decay_linear_attn,
    chunk_delta_rule,
    chunk_gated_delta_rule,
    chunk_linear_attn,
    chunk_longhorn,
    l2_normalize,
)

RuleName = Literal["linear_attn", "decay", "delta_rule", "gated_delta_rule", "longhorn"]
_GATED = ("decay", "gated_delta_rule")


class ParametricAttention(ContinualLearner):
    """A slow encoder trained online plus a fast state S of fixed size written by a fast-weight rule.

    Args:
        input_shape: Shape of one input (linked from the data module).
        num_outputs: Classes or regression targets (linked); d_v.
        task_type: Linked from the data module.
        rule: The fast rule from ``cl_lightning.ops``: ``"linear_attn"`` (Hebbian, with write strength β),
            ``"decay"`` (scalar-gate linear attention), ``"delta_rule"``, ``"gated_delta_rule"``, ``"longhorn"``
            (the reference code's diagonal form).
        protocol: ``"lifelong"`` (one persistent state) or ``"support_set"`` (a fresh state per chunk).
        hidden_sizes: Widths of the encoder MLP's hidden layers (§6.2: [256, 256] for Permuted MNIST).
        key_dim: d_k, per head.
        num_heads: Heads, each with its own key projection, β, gate and state; their readouts are averaged.
        encoder: ``"flatten"`` or ``"cnn"`` (the QOA paper's shared CNN) before the MLP.
        temperature: Initial readout temperature τ of the classification logits (learnable, kept positive).
        forget_init: Initial −log α ≈ softplus(dt_bias) of the gated rules (1e-3: α ≈ 0.999 per example).
        chunk_size: Tokens per chunk C of the ops' chunked forms (not the stream's chunk).
        optimizer: Optimiser factory for the slow parameters (default: Adam, lr 1e-4).
        seed: Seed of the learner's own sampling (unused: the learner draws nothing).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...] = (49,),
        num_outputs: int = 10,
        task_type: TaskType = "classification",
        rule: RuleName = "delta_rule",
        protocol: Literal["lifelong", "support_set"] = "lifelong",
        hidden_sizes: list[int] | None = None,
        key_dim: int = 128,
        num_heads: int = 1,
        encoder: Literal["flatten", "cnn"] = "flatten",
        temperature: float = 10.0,
        forget_init: float = 1e-3,
        chunk_size: int = 64,
        optimizer: OptimizerCallable = adam_1e4,
        seed: int = 0,
    ) -> None:
        super().__init__(input_shape, num_outputs, task_type, optimizer, seed)
        self.save_hyperparameters()
        hidden = [256, 256] if hidden_sizes is None else list(hidden_sizes)
        if not hidden or key_dim < 1 or num_heads < 1 or chunk_size < 1 or temperature <= 0 or forget_init <= 0:
            raise ValueError("need hidden_sizes, key_dim, num_heads, chunk_size >= 1 and temperature, forget_init > 0")
        self.rule, self.protocol, self.chunk_size = rule, protocol, chunk_size
        self.key_dim, self.num_heads = key_dim, num_heads
        self.encoder, features = make_encoder(encoder, self.input_shape)
        self.body = MLP(features, hidden[-1], hidden[:-1])  # h = relu(body(x))
        self.key_proj = nn.Linear(hidden[-1], num_heads * key_dim)
        self.beta_proj = nn.Linear(hidden[-1], num_heads)
        nn.init.normal_(self.beta_proj.weight, std=1e-3)  # β ≈ sigmoid(0) = 0.5 at the start
        nn.init.zeros_(self.beta_proj.bias)
        self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature)))
        if rule in _GATED:
            self.gate_proj = nn.Linear(hidden[-1], num_heads)
            nn.init.normal_(self.gate_proj.weight, std=1e-3)
            nn.init.zeros_(self.gate_proj.bias)
            self.a_log = nn.Parameter(torch.zeros(num_heads))  # A = 1
            dt_bias = forget_init + math.log(-math.expm1(-forget_init))  # inverse softplus (fla's dt_bias init)
            self.dt_bias = nn.Parameter(torch.full((num_heads,), dt_bias))
        self.register_buffer("fast_state", torch.zeros(num_heads, key_dim, num_outputs))  # the fast memory S

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Keys = queries ``(1, H, N, K)`` (L2-normalised), write strengths β ``(1, H, N)``, log-gates or None."""
        h = self.body(self.encoder(x)).relu()  # (N, D)
        keys = self.key_proj(h).view(h.shape[0], self.num_heads, self.key_dim).transpose(0, 1)  # (H, N, K)
        beta = self.beta_proj(h).sigmoid().T  # (H, N)
        g = None
        if self.rule in _GATED:
            g = -self.a_log.exp() * nn.functional.softplus(self.gate_proj(h) + self.dt_bias)  # (N, H), log α <= 0
            g = g.T.unsqueeze(0)  # (1, H, N)
        return l2_normalize(keys).unsqueeze(0), beta.unsqueeze(0), g

    def values(self, y: Tensor, dtype: torch.dtype) -> Tensor:
        """Values ``(1, H, N, V)``: onehot(y) for classification, y for regression, the same for every head."""
        v = nn.functional.one_hot(y, self.num_outputs) if self.task_type == "classification" else y.view(len(y), -1)
        return v.to(dtype).unsqueeze(0).expand(self.num_heads, -1, -1).unsqueeze(0)

    def write(
        self, keys: Tensor, values: Tensor, beta: Tensor, g: Tensor | None, state: Tensor, prequential: bool = True
    ) -> tuple[Tensor, Tensor]:
        """Run the rule from ``state (H, K, V)``: outputs ``(1, H, N, V)`` (read with q = k) and the final state."""
        s0 = state.unsqueeze(0).to(keys.dtype)  # (1, H, K, V)
        common = {"initial_state": s0, "prequential": prequential, "chunk_size": self.chunk_size}
        if self.rule == "linear_attn":
            o, s = chunk_linear_attn(keys, keys, values, beta, **common)
        elif self.rule == "decay":
            o, s = chunk_decay_linear_attn(keys, keys, values, g, beta, **common)
        elif self.rule == "delta_rule":
            o, s = chunk_delta_rule(keys, keys, values, beta, **common)
        elif self.rule == "gated_delta_rule":
            o, s = chunk_gated_delta_rule(keys, keys, values, beta, g, **common)
        else:
            o, s = chunk_longhorn(keys, keys, values, beta, **common)
        return o, s.squeeze(0)

    def read(self, state: Tensor, queries: Tensor) -> Tensor:
        """Readout ``(N, V)`` from ``state (H, K, V)`` and queries ``(1, H, N, K)``, no write."""
        return self.readout(queries @ state.to(queries.dtype))

    def readout(self, o: Tensor) -> Tensor:
        """Head-averaged ``Sᵀq``, ``(1, H, N, V) -> (N, V)``, times τ for classification logits."""
        o = o.squeeze(0).mean(0)  # (N, V)
        return o * self.log_temperature.exp() if self.task_type == "classification" else o

    def online_predictions(self, x: Tensor, y: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """Predict-then-write a chunk from ``state``: predictions ``(N, V)`` that never saw their own label, new S."""
        keys, beta, g = self.encode(x)
        o, new_state = self.write(keys, self.values(y, keys.dtype), beta, g, state, prequential=True)
        return self.readout(o), new_state

    def training_step(self, batch: StreamBatch, batch_idx: int) -> Tensor:
        """Prequential loss on the chunk (online metric), one step on θ, the chunk's final state written back."""
        x, y, _ = batch
        # a copy of the detached state: gradients stop at the chunk start, and the write-back below stays legal
        start = self.fast_state.clone() if self.protocol == "lifelong" else torch.zeros_like(self.fast_state)
        pred, new_state = self.online_predictions(x, y, start)
        loss = self.loss(pred, y)
        self.log_online(pred, y, loss)
        self.fast_state.copy_(new_state.detach())
        self.log_task_mean("train/state_norm", self.fast_state.norm())
        return loss

    def recontext_state(self, context_x: Tensor, context_y: Tensor) -> Tensor:
        """The context written into a fresh (zero) state ``(H, K, V)``."""
        keys, beta, g = self.encode(context_x)
        values = self.values(context_y, keys.dtype)
        return self.write(keys, values, beta, g, torch.zeros_like(self.fast_state), prequential=False)[1]

    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """Recontext reading: the context written into a fresh state, then read (live reading if no context)."""
        keys = self.encode(query_x)[0]
        if context_x.shape[0] == 0:
            return self.read(self.fast_state, keys)
        return self.read(self.recontext_state(context_x, context_y), keys)

    def extra_readings(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> dict[str, Tensor]:
        """The live reading (the live state, no writes), logged under ``*_live_*``."""
        return {"live": self.read(self.fast_state, self.encode(query_x)[0])}

    def probe_layers(self) -> dict[str, nn.Module]:
        """The encoder MLP's layers (their ReLU outputs are the hidden features; keys, β and gates are heads)."""
        return {f"body.layers.{i}": layer for i, layer in enumerate(self.body.layers)}

    def context_memory_bytes(self) -> int:
        """Bytes of the fast state S: the learner's whole context memory, constant over the stream."""
        return self.fast_state.numel() * self.fast_state.element_size()
