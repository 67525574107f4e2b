"""MAML with a replay buffer (Bekal et al. 2025, arXiv 2510.00365, Algorithm 2; docs/baselines.md §6), after Finn,
Abbeel & Levine 2017 (arXiv 1703.03400).

The FIFO buffer is cut into ``T`` equal contiguous regions (pseudo-tasks, not task ids); region ``i`` gives a
support slice ``S_i`` and the query slice ``Q_i`` right after it. Per meta-update:

    θ'_i = θ − α Σ_{n<5} ∇L(S_i)   (5 SGD steps, second order: the graph runs through them)
    θ ← Adam(θ, ∇θ (1/T) Σ_i L_{θ'_i}(Q_i))

Defaults follow the authors' Permuted-MNIST code, from which the figures came (docs/baselines.md §6). At evaluation
the network adapts on the first ``support_size`` context examples, as every replay learner takes its support set (the
paper: the task's last 10 training examples); adaptation is functional (``torch.func``): θ never changes.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from cl_lightning.contract import StreamBatch
from cl_lightning.learners.engines import StepRun
from cl_lightning.learners.replay import ReplayLearner
from cl_lightning.memory.support_sampler import pseudo_task_sample
from cl_lightning.nn.cnn import make_encoder
from cl_lightning.nn.mlp import MLP, InitName

Params = dict[str, Tensor]


class MAMLReplay(ReplayLearner):
    """Second-order MAML over contiguous pseudo-tasks of a FIFO replay buffer (manual optimisation).

    Args:
        hidden_sizes: MLP widths (PMNIST: [100, 100, 100, 100]; Split: [128, 128] after the CNN; SCR: [40]).
        init: MLP initialisation (PyTorch's default; the paper does not state one).
        encoder: ``"flatten"`` or ``"cnn"`` (Split: the shared CNN, adapted in the inner loop like everything else).
        memory_size: FIFO buffer capacity (code: 60,000 on PMNIST, 20,000 on Split and SCR).
        num_pseudo_tasks: Pseudo-tasks (buffer regions) per meta-update (PMNIST, Split: 5; SCR code: 20).
        support_size: Support slice per pseudo-task, and the context examples adapted on at evaluation (10; SCR 100).
        query_size: Query slice per pseudo-task (10; SCR code: 15).
        inner_steps: SGD steps of the inner loop (5).
        inner_lr: Inner-loop learning rate α (0.01).
        first_order: Drop the second-order terms (first-order MAML); default second order as the code.
        admission_prob: Probability that a stream example enters the buffer (PMNIST, SCR: 0.1; Split: 1).
        update_on: What may trigger a meta-update: each ``"admitted"`` example (PMNIST) or ``"chunk"`` (Split, SCR).
        update_prob: Probability that a trigger performs a meta-update (PMNIST, Split: 1; SCR: 0.01).
        start_when_full: Meta-update only once the buffer is full (the code); else once every region fits a slice.
        online_queries: Incoming examples per chunk predicted (adapted on the newest stored) for the online metric.
        **kwargs: :class:`~cl_lightning.learners.replay.ReplayLearner`'s but ``buffer_mode`` (always FIFO): the
            linked shapes, ``optimizer`` (the outer one: Adam, lr 1e-4) and ``seed`` (of admission, update and
            pseudo-task draws; they depend on ``(seed, step)`` only).
    """

    fixed_arguments = ("buffer_mode",)

    def __init__(
        self,
        *,
        hidden_sizes: list[int] | None = None,
        init: InitName = "default",
        encoder: Literal["flatten", "cnn"] = "flatten",
        memory_size: int = 60_000,
        num_pseudo_tasks: int = 5,
        support_size: int = 10,
        query_size: int = 10,
        inner_steps: int = 5,
        inner_lr: float = 0.01,
        first_order: bool = False,
        admission_prob: float = 0.1,
        update_on: Literal["admitted", "chunk"] = "admitted",
        update_prob: float = 1.0,
        start_when_full: bool = True,
        online_queries: int = 100,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            memory_size=memory_size,
            buffer_mode="fifo",
            support_size=support_size,
            online_queries=online_queries,
            **kwargs,
        )
        if min(num_pseudo_tasks, query_size) < 1 or inner_steps < 0:
            raise ValueError("num_pseudo_tasks and query_size must be >= 1 and inner_steps >= 0")
        if not (0 < admission_prob <= 1 and 0 < update_prob <= 1):
            raise ValueError("admission_prob and update_prob must lie in (0, 1]")
        if num_pseudo_tasks * (support_size + query_size) > memory_size:
            raise ValueError(f"{num_pseudo_tasks} pseudo-tasks of support + query slices exceed memory_size")
        self.num_pseudo_tasks, self.query_size = num_pseudo_tasks, query_size
        self.inner_steps, self.inner_lr, self.first_order = inner_steps, inner_lr, first_order
        self.admission_prob, self.update_on, self.update_prob = admission_prob, update_on, update_prob
        self.start_when_full = start_when_full
        hidden = [100, 100, 100, 100] if hidden_sizes is None else list(hidden_sizes)
        enc, features = make_encoder(encoder, self.input_shape)
        self.net = nn.Sequential(enc, MLP(features, self.num_outputs, hidden, init=init))

    def adapt(self, params: Params, x: Tensor, y: Tensor, second_order: bool = True) -> Params:
        """``inner_steps`` SGD steps on ``L(x, y)`` from ``params``; differentiable through them if ``second_order``."""

        def support_loss(p: Params) -> Tensor:
            return self.loss(functional_call(self.net, p, (x,)), y)

        for _ in range(self.inner_steps):  # sequential by definition
            grads = grad(support_loss)(params)
            params = {
                n: p - self.inner_lr * (g if second_order else g.detach())
                for (n, p), g in zip(params.items(), grads.values(), strict=True)
            }
        return params

    def meta_loss(self, sx: Tensor, sy: Tensor, qx: Tensor, qy: Tensor) -> Tensor:
        """Mean query loss after adapting on each support slice: ``sx (T, s, D), qx (T, q, D)`` -> scalar."""
        params = dict(self.net.named_parameters())

        def query_loss(sx: Tensor, sy: Tensor, qx: Tensor, qy: Tensor) -> Tensor:
            adapted = self.adapt(params, sx, sy, second_order=not self.first_order)
            return self.loss(functional_call(self.net, adapted, (qx,)), qy)

        return vmap(query_loss)(sx, sy, qx, qy).mean()

    @property
    def ready_size(self) -> int:
        """A full buffer (the authors' code), or every pseudo-task's support and query slices."""
        slices = self.num_pseudo_tasks * (self.support_size + self.query_size)
        return self.buffer.capacity if self.start_when_full else slices

    def output_layer(self) -> nn.Module:
        """The MLP's output layer."""
        return self.net[1].layers[-1]

    def _maybe_update(self, gen: torch.Generator, run: StepRun) -> None:
        if not self.ready() or (self.update_prob < 1 and float(torch.rand((), generator=gen)) >= self.update_prob):
            return
        q_idx, s_idx = pseudo_task_sample(
            len(self.buffer), self.num_pseudo_tasks, self.support_size, self.query_size, gen
        )
        s_idx, q_idx = s_idx.to(self.device, non_blocking=True), q_idx.to(self.device, non_blocking=True)
        (sx, sy), (qx, qy) = self.buffer.get(s_idx), self.buffer.get(q_idx)
        loss = self.meta_loss(sx, sy, qx, qy)
        run.step(loss)
        run.log_task_mean("train/loss", loss)

    def learn_chunk(self, batch: StreamBatch, run: StepRun) -> None:
        """Online metric, then admit examples to the buffer and run the meta-updates they trigger."""
        x, y, task_id = batch
        x = x.flatten(1)
        gen = self.step_generator()
        self.log_online_from_memory(x, y, run)  # predict_support differentiates the inner loop even under no_grad
        admitted = (torch.rand(x.shape[0], generator=gen) < self.admission_prob).nonzero().flatten()  # on the host
        admit = admitted.to(x.device, non_blocking=True)  # indices, not a mask: no device read
        x, y, task_id = x[admit], y[admit], task_id[admit]
        if self.update_on == "chunk":
            self.buffer.add(x, y, task_id)
            self._maybe_update(gen, run)
            return
        for i in range(x.shape[0]):  # sequential in the authors' code: each admitted example, then its update
            self.buffer.add(x[i : i + 1], y[i : i + 1], task_id[i : i + 1])
            self._maybe_update(gen, run)

    def predict_support(self, query_x: Tensor, support_x: Tensor, support_y: Tensor) -> Tensor:
        """Adapt a copy of θ on the supports (first order, θ untouched) and predict the queries; with gradients even
        under ``torch.no_grad`` or Lightning's ``inference_mode`` (the inputs are cloned out of it)."""
        with torch.inference_mode(False), torch.enable_grad():
            query_x, support_x, support_y = query_x.clone(), support_x.clone(), support_y.clone()
            params = {n: p.detach() for n, p in self.net.named_parameters()}
            if support_x.shape[0] > 0:
                params = self.adapt(params, support_x.flatten(1), support_y, second_order=False)
            return functional_call(self.net, params, (query_x.flatten(1),)).detach()
