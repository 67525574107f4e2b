"""Parametric attention: a fixed-size fast-weight memory written online (docs/parametric-attention.md).

McDermott, Heath Jr., Parhi (2026), "Lifelong In-Context Learning with Transformers Requires Parametric Forms of
Attention", arXiv:2606.25342: replace the growing key-value cache by a state of constant size trained at test time
by online regression. A slow encoder h_θ (trained online by Adam) gives, per example (x, y),

    k = q = l2n(W_k h_θ(x)),   v = onehot(y) (classification) or y (regression),
    β = sigmoid(w_βᵀ h + b_β),   log α = −exp(A_log) · softplus(w_αᵀ h + dt_bias)     (GDN gate parameterisation)

and the fast state S ∈ R^{d_k × d_v} (per head) is written by a rule from ``cl_lightning.ops``, e.g. the delta rule
S ← (I − β k kᵀ) S + β k vᵀ or the gated delta rule S ← α (I − β k kᵀ) S + β k vᵀ (the mechanism, every rule's state,
write and read: ``cl_lightning.nn.fast_weights``). Readout: logits = τ · Sᵀq (τ learnable; regression reads Sᵀq),
averaged over heads. The levers are the docs' §3; the protocols and the two evaluation readings (recontext into a
fresh S, and **live**, logged as ``eval/*_live_*``) its §4. Under DDP each rank keeps its own S.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from cl_lightning.contract import StreamBatch, TaskType
from cl_lightning.learners.base import ContinualLearner, adam_1e4
from cl_lightning.memory.accounting import tensor_bytes
from cl_lightning.nn.cnn import make_encoder
from cl_lightning.nn.fast_weights import DeltaRule, Encoded, FastWeightRule, State, as_state, as_tuple, gate_head
from cl_lightning.nn.mlp import MLP
from cl_lightning.ops import feature_map, l2_normalize
from cl_lightning.ops.feature_maps import FeatureMapName, input_width, random_fourier_weights

EncoderTraining = Literal["online", "frozen_random", "frozen_after_first_task"]


class ParametricAttention(ContinualLearner):
    """A slow encoder trained online plus a fast state of fixed size written by a fast-weight rule.

    Args:
        input_shape: Shape of one input (linked from the data module).
        num_outputs: Classes or regression targets (linked); d_v.
        task_type: Linked from the data module.
        rule: The fast-weight rule with its own hyperparameters, a class of ``cl_lightning.nn.fast_weights``:
            ``LinearAttention`` (Hebbian), ``DecayLinearAttention``, ``DeltaRule``, ``GatedDeltaRule``,
            ``Longhorn``, ``OmegaRule``, ``Titans``, ``TTTLinear``, ``TTTMLP``; None means ``DeltaRule()``.
        protocol: ``"lifelong"`` (one persistent state) or ``"support_set"`` (a fresh state per chunk).
        hidden_sizes: Widths of the encoder MLP's hidden layers (Permuted MNIST: [256, 256]).
        key_dim: d_k, per head: the rows of the state (the feature map's output width).
        num_heads: Heads, each with its own key projection, β, gates and state; their readouts are averaged.
        encoder: ``"flatten"`` or ``"cnn"`` (the QOA paper's shared CNN) before the MLP.
        temperature: Initial readout temperature τ of the classification logits (learnable, kept positive).
        feature_map: Key/query map φ applied before L2 normalisation: ``"identity"``, ``"elu1"``, ``"poly2"``
            (key_dim must be a square: the key projection has √key_dim outputs) or ``"random_fourier"``.
        kv_pairs: Key–value pairs P written per example (P keys, each with the example's value; read with the mean
            of the P queries); linear-readout rules only. Gates, windows and mini-batches count pairs, not examples.
        encoder_training: ``"online"`` (the key path trained with the rest), ``"frozen_random"`` (encoder, body
            and key projection never trained) or ``"frozen_after_first_task"``.
        optimizer: Optimiser factory for the slow parameters (default: Adam, lr 1e-4).
        seed: Seed of the learner's own sampling (the random-feature projection and the TTT state init).
    """

    def __init__(
        self,
        *,
        input_shape: tuple[int, ...] = (49,),
        num_outputs: int = 10,
        task_type: TaskType = "classification",
        rule: FastWeightRule | None = None,
        protocol: Literal["lifelong", "support_set"] = "lifelong",
        hidden_sizes: list[int] | None = None,
        key_dim: int = 128,
        num_heads: int = 1,
        encoder: Literal["flatten", "cnn"] = "flatten",
        temperature: float = 10.0,
        feature_map: FeatureMapName = "identity",
        kv_pairs: int = 1,
        encoder_training: EncoderTraining = "online",
        optimizer: OptimizerCallable = adam_1e4,
        seed: int = 0,
    ) -> None:
        super().__init__(
            input_shape=input_shape, num_outputs=num_outputs, task_type=task_type, optimizer=optimizer, seed=seed
        )
        rule = DeltaRule() if rule is None else rule
        hidden = [256, 256] if hidden_sizes is None else list(hidden_sizes)
        if not hidden or key_dim < 1 or num_heads < 1 or kv_pairs < 1 or temperature <= 0:
            raise ValueError("need hidden_sizes, key_dim, num_heads, kv_pairs >= 1 and temperature > 0")
        if kv_pairs > 1 and not rule.linear_readout:
            raise ValueError(f"kv_pairs > 1 needs a linear readout; {rule!r} reads through a non-linear model")
        if encoder_training not in ("online", "frozen_random", "frozen_after_first_task"):
            raise ValueError(f"unknown encoder_training {encoder_training!r}")
        self.rule, self.protocol = rule, protocol
        self.feature_map, self.encoder_training = feature_map, encoder_training
        self.key_dim, self.num_heads, self.kv_pairs = key_dim, num_heads, kv_pairs
        self.proj_dim = input_width(feature_map, key_dim)  # the key projection's width before φ
        self.encoder, features = make_encoder(encoder, self.input_shape)
        self.body = MLP(features, hidden[-1], hidden[:-1])  # h = relu(body(x))
        self.key_proj = nn.Linear(hidden[-1], kv_pairs * num_heads * self.proj_dim)
        self.beta_proj = gate_head(hidden[-1], num_heads)  # β ≈ sigmoid(0) = 0.5 at the start
        self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature)))
        gen = torch.Generator().manual_seed(seed)
        if feature_map == "random_fourier":
            self.register_buffer("rff_weights", random_fourier_weights(self.proj_dim, key_dim, gen))
        rule.setup(self, hidden[-1], num_heads, key_dim, num_outputs)  # the rule's gates and slow weights, on self
        init = rule.initial_state(num_heads, key_dim, num_outputs, gen)
        self.state_names = list(init)  # the fast state's buffers, ``fast_state`` first
        if rule.learned_init:  # TTT's initial fast weights are slow parameters
            self.state_init = nn.ParameterList([nn.Parameter(t.clone()) for t in init.values()])
        for name, tensor in init.items():
            self.register_buffer(name, tensor.clone())
        if encoder_training == "frozen_random":
            self.freeze_keys()

    def freeze_keys(self) -> None:
        """Stop training the key path (encoder, body, key projection): keys no longer drift under the state."""
        for module in (self.encoder, self.body, self.key_proj):
            module.requires_grad_(False)

    def on_train_epoch_start(self) -> None:
        """Freeze the key path from the second task on, if ``encoder_training="frozen_after_first_task"``."""
        super().on_train_epoch_start()
        if self.encoder_training == "frozen_after_first_task" and self.current_epoch >= 1:
            self.freeze_keys()

    # --- the fast state -------------------------------------------------------------------------------------------

    def live_state(self) -> State:
        """The live fast state: ``fast_state`` ``(H, K, V)``, or a tuple of buffers for multi-tensor rules."""
        return as_state(tuple(getattr(self, name) for name in self.state_names))

    def fresh_state(self) -> State:
        """The state a new context is written into: zeros, or the learned initial fast weights of the TTT rules."""
        if self.rule.learned_init:
            return tuple(self.state_init)
        return as_state(tuple(torch.zeros_like(getattr(self, name)) for name in self.state_names))

    def _set_state(self, state: State) -> None:
        for name, tensor in zip(self.state_names, as_tuple(state), strict=True):
            getattr(self, name).copy_(tensor.detach())

    # --- tokens ---------------------------------------------------------------------------------------------------

    def encode(self, x: Tensor) -> Encoded:
        """Keys = queries (φ then L2-normalised), write strengths β and the rule's gates for a chunk ``x``."""
        h = self.body(self.encoder(x)).relu()  # (N, D)
        n, heads = h.shape[0], self.num_heads
        raw = self.key_proj(h).view(n, self.kv_pairs, heads, self.proj_dim).permute(2, 0, 1, 3)  # (H, N, P, D)
        keys = l2_normalize(feature_map(raw, self.feature_map, getattr(self, "rff_weights", None)))
        keys = keys.unsqueeze(0) if self.kv_pairs > 1 else keys[:, :, 0].unsqueeze(0)  # (1, H, N[, P], K)
        beta = self.beta_proj(h).sigmoid().T.unsqueeze(0)  # (1, H, N)
        return Encoded(keys, beta, **self.rule.gates(self, h))

    def read_keys(self, x: Tensor) -> Tensor:
        """The keys the state is read with for ``x``, (H, N, K) (``kv_pairs`` keys of an example: their mean)."""
        keys = self.encode(x).keys[0]  # (H, N[, P], K)
        return keys.mean(2) if keys.dim() == 4 else keys

    def values(self, y: Tensor, dtype: torch.dtype) -> Tensor:
        """Values ``(1, H, N, V)``: onehot(y) for classification, y for regression, the same for every head."""
        v = nn.functional.one_hot(y, self.num_outputs) if self.task_type == "classification" else y.view(len(y), -1)
        return v.to(dtype).unsqueeze(0).expand(self.num_heads, -1, -1).unsqueeze(0)

    # --- write and read -------------------------------------------------------------------------------------------

    def write(self, enc: Encoded, values: Tensor, state: State, prequential: bool = True) -> tuple[Tensor, State]:
        """Run the rule from ``state``: outputs ``(1, H, N, V')`` (read with q = k, before the readout head) and the
        final state (same structure as ``state``)."""
        return self.rule.write(self, enc, values, state, prequential)

    def read(self, state: State, queries: Tensor) -> Tensor:
        """Readout ``(N, V)`` from ``state`` and queries ``(1, H, N, K)`` (or ``(1, H, N, P, K)``), no write."""
        return self.readout(self.rule.read(self, state, queries))

    def readout(self, o: Tensor) -> Tensor:
        """Head-averaged ``Sᵀq``, ``(1, H, N, V) -> (N, V)``, times τ for classification logits."""
        o = o.squeeze(0).mean(0)  # (N, V)
        return o * self.log_temperature.exp() if self.task_type == "classification" else o

    def online_predictions(self, x: Tensor, y: Tensor, state: State) -> tuple[Tensor, State]:
        """Predict-then-write a chunk from ``state``: predictions ``(N, V)`` that never saw their own label, new S."""
        enc = self.encode(x)
        o, new_state = self.write(enc, self.values(y, enc.keys.dtype), state, prequential=True)
        return self.readout(o), new_state

    def training_step(self, batch: StreamBatch, batch_idx: int) -> Tensor:
        """Prequential loss on the chunk (online metric), one step on θ, the chunk's final state written back."""
        x, y, _ = batch
        # a copy of the detached state: gradients stop at the chunk start, and the write-back below stays legal
        lifelong = self.protocol == "lifelong"
        start = as_state(tuple(t.clone() for t in as_tuple(self.live_state()))) if lifelong else self.fresh_state()
        pred, new_state = self.online_predictions(x, y, start)
        loss = self.loss(pred, y)
        self.log_online(pred, y, loss)
        self._set_state(new_state)
        self.log_task_mean("train/state_norm", self.fast_state.norm())
        return loss

    def recontext_state(self, context_x: Tensor, context_y: Tensor) -> State:
        """The context written into a fresh state (zeros, or the TTT rules' learned initial weights)."""
        enc = self.encode(context_x)
        return self.write(enc, self.values(context_y, enc.keys.dtype), self.fresh_state(), prequential=False)[1]

    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """Recontext reading: the context written into a fresh state, then read (live reading if no context)."""
        keys = self.encode(query_x).keys
        state = self.live_state() if context_x.shape[0] == 0 else self.recontext_state(context_x, context_y)
        return self.read(state, keys)

    def extra_readings(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> dict[str, Tensor]:
        """The live reading (the live state, no writes), logged under ``*_live_*``."""
        return {"live": self.read(self.live_state(), self.encode(query_x).keys)}

    def output_layer(self) -> nn.Module:
        """The last trained layer on the read-out path (β and the gates only shape the writes): the key (= query)
        projection of τ · Sᵀ φ(W_k h), or the rule's own (TTT-Linear's value embedding)."""
        layer = self.rule.output_layer(self)
        return self.key_proj if layer is None else layer

    def probe_layers(self) -> dict[str, nn.Module]:
        """The encoder MLP's layers (their ReLU outputs are the hidden features; keys, β and gates are heads)."""
        return {f"body.layers.{i}": layer for i, layer in enumerate(self.body.layers)}

    def context_memory_bytes(self) -> int:
        """Bytes of the fast state (every buffer of it): the whole context memory, constant over the stream."""
        return tensor_bytes(as_tuple(self.live_state()))
