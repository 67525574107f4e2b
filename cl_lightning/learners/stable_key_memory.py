"""Stable-key memory: a constant-memory fast-weight learner built on what empties parametric attention's state.

McDermott, Heath Jr., Parhi (2026, arXiv:2606.25342) ask for a bounded, eviction-free context memory (properties 1
and 4). Against the three causes measured in ``ParametricAttention`` (docs/results/lifelong_icl.md §3: key drift
under the slow encoder, the low rank and high |cos| of ReLU keys, the write volume on a single state):

    z = standardise(x),   k = sign(R z) / √d_k   (R ~ N(0, 1) fixed: no drift, rank d_k, zero mean, |cos| ≈ 0)
    route r: a chunk goes to the state m whose centroid c_m (sum of the inputs it took) is closest in cosine;
             below ``route_threshold`` (a new input distribution) to the next state in turn, whose centroid
             restarts from the chunk (the oldest distribution's state is reassigned); a query to its closest
    S_r ← (I − β k kᵀ) S_r + β k vᵀ  (delta rule, or gated with α),   logits = τ · S_rᵀ k

The M states are ``ParametricAttention``'s heads: a token's key is zero in every head but its route's, so the
other states are untouched by its write and silent at its read. β (and α) come from a slow encoder trained online;
the keys never see a gradient. Context memory: the M states and centroids, constant; a query also reads the fixed
projection R (``fixed_buffers``), which ``cl_lightning.memory.accounting.memory_bytes`` counts too.
"""

from __future__ import annotations

import math

import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn

from cl_lightning.contract import StreamBatch, TaskType
from cl_lightning.learners.base import adam_1e4
from cl_lightning.learners.parametric_attention import ParametricAttention
from cl_lightning.memory.accounting import tensor_bytes
from cl_lightning.nn.fast_weights import DeltaRule, Encoded, GatedDeltaRule


class StableKeyMemory(ParametricAttention):
    """Fixed random sign keys of the standardised input, written into one of ``routes`` fast states.

    Prior art: routing writes into one of several memory states (Mixture-of-Memories, Du et al. 2025) and fixed
    random features with an online-trained linear read-out (RanDumb, Prabhu et al., NeurIPS 2024).

    Args:
        input_shape: Shape of one input (linked from the data module).
        num_outputs: Classes or regression targets (linked); d_v.
        task_type: Linked from the data module.
        rule: ``DeltaRule`` or ``GatedDeltaRule`` (``cl_lightning.nn.fast_weights``); None means ``DeltaRule()``.
        routes: Fast states M (1: a single state, no routing).
        key_dim: d_k of each state: the width of the fixed sign projection.
        route_threshold: A chunk whose cosine to every used centroid is below this opens the next state in turn.
        hidden_sizes: Widths of the slow encoder MLP (it makes β and the gates only).
        temperature: Initial readout temperature τ (learnable).
        optimizer: Optimiser factory for the slow parameters (default: Adam, lr 1e-4).
        seed: Seed of the fixed key projection.
    """

    fixed_buffers = ("key_matrix",)  # untrained state a query reads: counted by memory.accounting.memory_bytes

    def __init__(
        self,
        *,
        input_shape: tuple[int, ...] = (49,),
        num_outputs: int = 10,
        task_type: TaskType = "classification",
        rule: DeltaRule | GatedDeltaRule | None = None,
        routes: int = 8,
        key_dim: int = 112,
        route_threshold: float = 0.5,
        hidden_sizes: list[int] | None = None,
        temperature: float = 10.0,
        optimizer: OptimizerCallable = adam_1e4,
        seed: int = 0,
    ) -> None:
        if routes < 1 or not -1.0 <= route_threshold <= 1.0:
            raise ValueError("need routes >= 1 and route_threshold in [-1, 1]")
        super().__init__(
            input_shape=input_shape, num_outputs=num_outputs, task_type=task_type, rule=rule, hidden_sizes=hidden_sizes,
            key_dim=key_dim, num_heads=routes, temperature=temperature, optimizer=optimizer, seed=seed,
        )  # fmt: skip
        self.routes, self.route_threshold = routes, route_threshold
        width = math.prod(self.input_shape)
        gen = torch.Generator().manual_seed(seed + 1)
        self.register_buffer("key_matrix", torch.randn(key_dim, width, generator=gen))  # R, never trained
        self.register_buffer("centroids", torch.zeros(routes, width))
        self.register_buffer("next_route", torch.zeros((), dtype=torch.long))
        self.key_proj.requires_grad_(False)  # the learned key path is unused: keys come from R

    @staticmethod
    def standardise(x: Tensor) -> Tensor:
        """Each input flattened, centred and scaled to unit variance: ``(N, D)``."""
        z = x.flatten(1)
        return (z - z.mean(1, keepdim=True)) / (z.std(1, keepdim=True) + 1e-6)

    def features(self, x: Tensor) -> Tensor:
        """Keys ``(N, K)``: sign(R z) / √K, unit norm, a fixed function of the input."""
        return torch.sign(self.standardise(x) @ self.key_matrix.T) / math.sqrt(self.key_dim)

    def centroid_cosines(self, z: Tensor) -> Tensor:
        """Cosines of standardised inputs ``z`` (``(N, D)`` or ``(D,)``) to each state's centroid, ``(N, M)`` or
        ``(M,)``; -2 for a state not used yet."""
        cos = nn.functional.normalize(z, dim=-1) @ nn.functional.normalize(self.centroids, dim=1).T
        return cos.masked_fill(self.centroids.abs().sum(1) == 0, -2.0)

    def route(self, x: Tensor) -> Tensor:
        """Each input's closest used state by cosine to its centroid ``(N,)`` (state 0 before any is used)."""
        return self.centroid_cosines(self.standardise(x)).argmax(1)

    @torch.no_grad()
    def route_chunk(self, x: Tensor) -> int:
        """The state a training chunk is written into (the closest, or the next in turn if none is close enough);
        the chunk's inputs are added to its centroid."""
        z = self.standardise(x)
        cos = self.centroid_cosines(z.sum(0))
        if cos.max() >= self.route_threshold:
            r = int(cos.argmax())
        else:  # a new input distribution: the next state in turn, its centroid restarted (its content is overwritten
            r = int(self.next_route)  # as it is used: the oldest distribution's state is the one reassigned)
            self.next_route.fill_((r + 1) % self.routes)
            self.centroids[r].zero_()
        self.centroids[r] += z.sum(0)
        return r

    def encode(self, x: Tensor, route: int | None = None) -> Encoded:
        """β and gates from the slow encoder; keys ``(1, M, N, K)``, zero outside each token's route."""
        enc = super().encode(x)
        n = x.shape[0]
        routes = self.route(x) if route is None else torch.full((n,), route, device=x.device)
        keys = x.new_zeros(1, self.routes, n, self.key_dim)
        keys[0, routes, torch.arange(n, device=x.device)] = self.features(x)
        return enc._replace(keys=keys)

    def readout(self, o: Tensor) -> Tensor:
        """The routed state's ``Sᵀk`` (the other states read zero), times τ for classification logits."""
        o = o.squeeze(0).sum(0)  # (N, V)
        return o * self.log_temperature.exp() if self.task_type == "classification" else o

    def training_step(self, batch: StreamBatch, batch_idx: int) -> Tensor:
        """Route the chunk, predict-then-write it into its state (online metric), one step on the slow weights."""
        x, y, _ = batch
        enc = self.encode(x, self.route_chunk(x))
        out, new_state = self.write(enc, self.values(y, enc.keys.dtype), self.fast_state.clone(), prequential=True)
        pred = self.readout(out)
        loss = self.loss(pred, y)
        self.log_online(pred, y, loss)
        self._set_state(new_state)
        return loss

    def output_layer(self) -> nn.Module:
        """The last trained layer that shapes what is read: the write strength β's head (the keys are fixed)."""
        return self.beta_proj

    def context_memory_bytes(self) -> int:
        """Bytes of the fast states, the centroids and the route counter: constant over the stream."""
        return tensor_bytes((self.fast_state, self.centroids, self.next_route))
