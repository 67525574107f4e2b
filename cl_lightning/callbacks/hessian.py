"""Hessian effective rank of the learner's loss on held-out queries of the current task (docs/metrics.md §4)."""

from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from cl_lightning.callbacks.probing import due_task, evaluation_mode, probe_episode, require_contract
from cl_lightning.contract import ObservedLearner
from cl_lightning.heap import release_free_heap
from cl_lightning.metrics import (
    exact_eigvals,
    flat_loss,
    hessian_effective_rank,
    hessian_srank,
    lanczos_eigvals,
    make_hvp,
    slq_effective_rank,
    slq_spectral_density,
    summed_hvp,
)


class _Episode(nn.Module):
    """``forward((context_x, context_y, query_x)) = learner.predict_episode(...)``: lets ``functional_call`` swap the
    learner's parameters (prefixed ``learner.``) while the learner answers an episode."""

    def __init__(self, learner: ObservedLearner) -> None:
        super().__init__()
        self.learner = learner

    def forward(self, episode: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """Predictions for the episode's queries."""
        return self.learner.predict_episode(*episode)


class HessianMonitor(Callback):
    """Effective rank, srank, top eigenvalue and trace of the loss Hessian, at the end of every n-th task
    (docs/metrics.md §4: the logged values, the two methods, the cost and memory knobs, the paper's choices).

    In eval mode, the learner's own loss on the task's held-out queries answered from the episode's context (a
    support-set learner with its support set, as the paper), differentiated with respect to a flat parameter block
    through ``torch.func.functional_call`` (:func:`~cl_lightning.metrics.flat_loss`; nothing touches ``.grad``, the
    optimiser or the weights).

    Args:
        method: ``"exact"`` (a block, default the last layer) or ``"lanczos"`` (default the whole network).
        every_n_tasks: Measure after every n-th evaluated task (task 0 included; warm-up tasks never).
        num_queries: Held-out queries of the current task in the loss (paper: 100 for QOA, 2,000 for BP).
        parameters: Names (``named_parameters``) of the block; None: the learner's ``output_layer()`` for
            ``"exact"``, every trainable parameter for ``"lanczos"``.
        jitter: Added to every eigenvalue before the entropy (paper code: 1e-6).
        clamp: Lower bound of the shifted eigenvalues (paper code: 1e-12); None: their absolute value.
        srank_delta: δ of srank on |λ|.
        chunk_size: HVP columns vmapped together by the exact method (memory knob).
        top_k: Eigenvalues ``eigsh`` finds (``"lanczos"``); the largest is logged.
        tol: ``eigsh`` relative accuracy (``"lanczos"``; 0: machine precision, more HVPs).
        num_probes: SLQ Rademacher probes (``"lanczos"``).
        num_steps: Lanczos steps per SLQ probe (``"lanczos"``).
        seed: Seed of the Lanczos start vector and the SLQ probes (fixed, so curves are comparable over tasks).
        query_chunk: Queries per HVP chunk (memory knob, same Hessian up to rounding); None: all at once.
        max_exact_params: Largest block the exact method measures (None: no bound).
    """

    def __init__(
        self,
        method: Literal["exact", "lanczos"] = "exact",
        every_n_tasks: int = 10,
        num_queries: int = 100,
        parameters: list[str] | None = None,
        jitter: float = 1e-6,
        clamp: float | None = 1e-12,
        srank_delta: float = 0.01,
        chunk_size: int | None = 256,
        top_k: int = 1,
        tol: float = 1e-4,
        num_probes: int = 8,
        num_steps: int = 32,
        seed: int = 0,
        query_chunk: int | None = None,
        max_exact_params: int | None = 16384,
    ) -> None:
        if every_n_tasks < 1 or num_queries < 1 or top_k < 1 or (query_chunk is not None and query_chunk < 1):
            raise ValueError(
                "every_n_tasks, num_queries, top_k and query_chunk must be positive, got "
                f"every_n_tasks={every_n_tasks}, num_queries={num_queries}, top_k={top_k}, query_chunk={query_chunk}"
            )
        self.method, self.every_n_tasks, self.num_queries = method, every_n_tasks, num_queries
        self.parameters = parameters
        self.jitter, self.clamp, self.srank_delta, self.chunk_size = jitter, clamp, srank_delta, chunk_size
        self._skip = False
        self.query_chunk, self._chunks_checked = query_chunk, False
        self.tol, self.top_k, self.num_probes, self.num_steps, self.seed = tol, top_k, num_probes, num_steps, seed
        self.max_exact_params = max_exact_params

    def setup(self, trainer: Trainer, pl_module: ObservedLearner, stage: str) -> None:
        """Check that the learner and the data module offer what the monitor calls."""
        require_contract(trainer, pl_module, type(self).__name__)

    def block(self, pl_module: ObservedLearner) -> list[str]:
        """The names of the parameter block differentiated (``parameters``' default; none without an output layer)."""
        if self.parameters is not None:
            return list(self.parameters)
        if self.method == "exact":
            layer = pl_module.output_layer()
            own = set() if layer is None else {id(p) for p in layer.parameters()}
            return [name for name, p in pl_module.named_parameters() if id(p) in own]
        return [name for name, p in pl_module.named_parameters() if p.requires_grad]

    def measure(self, pl_module: ObservedLearner, episode: list[Tensor]) -> dict[str, Tensor]:
        """The Hessian scalars on one episode, by logged name."""
        cx, cy, qx, _ = episode
        names = [f"learner.{n}" for n in self.block(pl_module)]
        model = _Episode(pl_module)
        # SDPA's fused CPU/CUDA kernels have no forward-mode AD; the math backend is plain ops
        with evaluation_mode(pl_module), torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
            parts = []
            for qx_part, qy_part in self.query_chunks(pl_module, episode):
                loss_fn, theta = flat_loss(model, pl_module.loss, (cx, cy, qx_part), qy_part, names)
                parts.append((qx_part.shape[0] / qx.shape[0], make_hvp(loss_fn, theta)))
            hvp, n = summed_hvp(parts), theta.numel()
            if self.method == "exact":
                eig = exact_eigvals(hvp, n, chunk_size=self.chunk_size)
                if not bool(eig.any()):  # the jitter alone would give erank = P: a wrong number, not a small one
                    raise RuntimeError("the Hessian is exactly zero: predict_episode does not use the block's tensors")
                return {
                    "hessian/eff_rank": hessian_effective_rank(eig, self.jitter, self.clamp),
                    "hessian/srank": hessian_srank(eig, self.srank_delta).to(torch.float64),
                    "hessian/top_eigval": eig[0],
                    "hessian/trace": eig.sum(),
                    "hessian/num_params": torch.tensor(float(n)),
                }
            top = lanczos_eigvals(hvp, n, k=min(self.top_k, n - 1), tol=self.tol, seed=self.seed)
            nodes, weights = slq_spectral_density(hvp, n, self.num_probes, self.num_steps, self.seed)
        return {
            "hessian/lanczos/eff_rank": slq_effective_rank(nodes, weights, n, self.jitter, self.clamp),
            "hessian/lanczos/top_eigval": top[0],
            "hessian/lanczos/trace": n * (weights * nodes).sum(),
            "hessian/lanczos/num_params": torch.tensor(float(n)),
        }

    def query_chunks(self, pl_module: ObservedLearner, episode: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
        """The episode's ``(query_x, query_y)`` in chunks of ``query_chunk`` (the whole if None or if the premise
        failed): checked once per run, on the loss value, that the chunks' size-weighted mean loss is the episode's."""
        cx, cy, qx, qy = episode
        if self.query_chunk is None or self.query_chunk >= qx.shape[0]:
            return [(qx, qy)]
        chunks = list(zip(qx.split(self.query_chunk), qy.split(self.query_chunk), strict=True))
        if not self._chunks_checked:
            self._chunks_checked = True
            with evaluation_mode(pl_module), torch.no_grad():
                whole = pl_module.loss(pl_module.predict_episode(cx, cy, qx), qy)
                summed = sum(
                    x.shape[0] / qx.shape[0] * pl_module.loss(pl_module.predict_episode(cx, cy, x), y)
                    for x, y in chunks
                )
            if not torch.allclose(summed, whole, rtol=1e-4, atol=1e-6):
                rank_zero_warn(
                    f"HessianMonitor: the loss over query chunks of {self.query_chunk} ({float(summed):.6g}) is not "
                    f"the episode's ({float(whole):.6g}): this learner's queries interact or its loss is not a mean "
                    "over queries, so the Hessian is taken on whole episodes (query_chunk=None)"
                )
                self.query_chunk = None
                return [(qx, qy)]
        return chunks

    def on_train_epoch_end(self, trainer: Trainer, pl_module: ObservedLearner) -> None:
        """After every n-th task: measure on the current task's held-out queries and log."""
        task = due_task(trainer, self.every_n_tasks)
        if task is None or self._skip:
            return
        block = self.block(pl_module)
        if not block:
            self._give_up("the learner has no parameter block to differentiate (no output_layer() / parameters)")
            return
        names = set(block)
        size = sum(p.numel() for n, p in pl_module.named_parameters() if n in names)
        if self.method == "exact" and self.max_exact_params is not None and size > self.max_exact_params:
            self._give_up(
                f"the exact block has {size:,} parameters, above max_exact_params={self.max_exact_params:,} ({size:,} "
                f"HVPs of the whole episode and a {size:,}² matrix per measurement); use method='lanczos' or raise "
                "the bound"
            )
            return
        episode = probe_episode(trainer, pl_module, task, self.num_queries)
        try:
            values = self.measure(pl_module, episode)
        except RuntimeError as err:  # e.g. a predict_episode that torch.func cannot transform
            self._give_up(f"torch.func could not differentiate predict_episode ({err})")
            return
        finally:
            release_free_heap()  # ~200 MB of HVP intermediates at paper size would otherwise stay resident
        for name, value in values.items():
            pl_module.log(name, value.float(), on_step=False, on_epoch=True, batch_size=1)

    def _give_up(self, why: str) -> None:
        """Warn once and stop measuring: a metric must not end a long run."""
        self._skip = True
        rank_zero_warn(f"HessianMonitor switched off for this run: {why}")
