"""The loss-of-plasticity measures of the representation (Dohare et al., Nature 2024; docs/metrics.md §3).

The fourth, online accuracy averaged per task, is logged by the learners themselves (``train/online_acc``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch._C._functorch import get_unwrapped, is_functorch_wrapped_tensor

from cl_lightning.callbacks.probing import due_task, evaluation_mode, probe_episode, require_contract
from cl_lightning.contract import ObservedLearner
from cl_lightning.heap import release_free_heap
from cl_lightning.metrics import (
    dead_unit_fraction,
    dormant_unit_fraction,
    entropy_effective_rank,
    srank,
    weight_magnitude,
)


def _as_rows(module: nn.Module, out: Tensor) -> Tensor:
    """Features as (rows, units): (…, D) → (N, D); a convolution's (N, C, *spatial) → (N·positions, C).

    Unwrapped from torch.func (same values): under a learner's functional adaptation (MAML's inner loop) the in-place
    writes of :class:`StridedRows` would be refused as mutations of a captured tensor.
    """
    while is_functorch_wrapped_tensor(out):
        out = get_unwrapped(out)
    if isinstance(module, nn.modules.conv._ConvNd):
        out = out.movedim(1, -1)
    return out.reshape(-1, out.shape[-1])


class StridedRows:
    """Evenly strided rows of a stream of ``(n, units)`` blocks, in one preallocated ``(2 · max_rows, units)`` buffer.

    Rows whose global index is a multiple of a stride ``s`` are kept; when more than ``2 · max_rows`` would be kept,
    every other one is dropped and ``s`` doubles. :meth:`rows` then takes ``max_rows`` evenly spaced rows of those
    kept (of the whole stream when it has at most ``2 · max_rows`` rows). One buffer, allocated at the first block,
    so no per-block copies fragment the heap between the forward pass's activations.
    """

    def __init__(self, max_rows: int) -> None:
        self.max_rows, self.stride, self.seen = max_rows, 1, 0
        self.buffer: Tensor | None = None  # (2 · max_rows, units) once the first block arrives
        self.count = 0

    def add(self, block: Tensor) -> None:
        """Take the rows of ``block`` (the next rows of the stream) whose index is a multiple of the stride."""
        first = (-self.seen) % self.stride
        start = self.seen + first  # global index of the block's first kept row
        self.seen += block.shape[0]
        part = block[first :: self.stride]
        if self.buffer is None:
            self.buffer = block.new_empty(2 * self.max_rows, block.shape[1])
        while self.count + part.shape[0] > self.buffer.shape[0]:  # kept rows are at k·s: keep even k, double s
            half = self.buffer[: self.count : 2].clone()
            self.buffer[: half.shape[0]] = half
            self.count = half.shape[0]
            part = part[(start // self.stride) % 2 :: 2]  # the block's rows at multiples of the doubled stride
            start += self.stride * ((start // self.stride) % 2)
            self.stride *= 2
        self.buffer[self.count : self.count + part.shape[0]] = part
        self.count += part.shape[0]

    def rows(self) -> Tensor:
        """At most ``max_rows`` evenly spaced rows of those kept, as ``(rows, units)``."""
        rows = self.buffer[: self.count] if self.buffer is not None else torch.empty(0, 0)
        if rows.shape[0] > self.max_rows:  # evenly strided rows: a pair scorer's rows run query by query
            rows = rows[torch.linspace(0, rows.shape[0] - 1, self.max_rows, device=rows.device).long()]
        return rows.clone()


class PlasticityMonitor(Callback):
    """Dead / dormant units, weight magnitude and feature ranks of each probed hidden layer, every n tasks
    (docs/metrics.md §3: the logged ``plasticity/*`` values and their definitions).

    At the start of task ``t`` (``t % every_n_tasks == 0``), before any training on it (LoP's timing), the learner
    answers the first ``probe_size`` held-out queries of task ``t`` with ``predict_episode`` in eval mode; forward
    hooks on ``pl_module.probe_layers()`` record each layer's output for that one pass. Features are
    ``activation(output)``: the package's nets apply ReLU after their hidden ``nn.Linear`` layers functionally, so the
    Linear outputs are pre-activations. Cost: one forward pass and one SVD of at most ``max_rows × units`` per layer.

    Args:
        every_n_tasks: Measure at the start of every n-th evaluated task (task 0 included; warm-up tasks never).
        probe_size: Held-out queries of the current task in the probe batch (LoP: 2,000 inputs).
        max_rows: Rows kept per layer (a pair scorer sees queries × supports rows); evenly strided beyond it.
        dormant_tau: Sokar's dormancy threshold τ on the normalised mean activation.
        srank_delta: δ of srank (Kumar et al.: 0.01).
        activation: Applied to each hooked output before measuring (``"relu"`` or ``"identity"``).
    """

    def __init__(
        self,
        every_n_tasks: int = 1,
        probe_size: int = 2000,
        max_rows: int = 4096,
        dormant_tau: float = 0.01,
        srank_delta: float = 0.01,
        activation: Literal["relu", "identity"] = "relu",
    ) -> None:
        if every_n_tasks < 1 or probe_size < 1 or max_rows < 1:
            raise ValueError(
                "every_n_tasks, probe_size and max_rows must be positive, got "
                f"every_n_tasks={every_n_tasks}, probe_size={probe_size}, max_rows={max_rows}"
            )
        self.every_n_tasks, self.probe_size, self.max_rows = every_n_tasks, probe_size, max_rows
        self.dormant_tau, self.srank_delta, self.activation = dormant_tau, srank_delta, activation
        self._warned = False

    def features(self, pl_module: ObservedLearner, episode: list[Tensor]) -> dict[str, Tensor]:
        """Each probed layer's features on one ``predict_episode`` pass: ``{name: (rows, units)}``, subsampled as
        they stream out (:class:`StridedRows`): a pair scorer's query–support rows never sit in memory together."""
        captured: dict[str, StridedRows] = {}

        def hook(name: str) -> Callable[[nn.Module, Any, Tensor], None]:
            def record(module: nn.Module, args: Any, out: Tensor) -> None:
                if isinstance(out, Tensor):
                    rows = _as_rows(module, out.detach())
                    with torch._C._DisableFuncTorch():  # plain tensor ops even inside a learner's torch.func transform
                        captured.setdefault(name, StridedRows(self.max_rows)).add(rows)

            return record

        handles = [m.register_forward_hook(hook(name)) for name, m in pl_module.probe_layers().items()]
        try:
            with evaluation_mode(pl_module):
                pl_module.predict_episode(*episode[:3])
        finally:
            for h in handles:
                h.remove()
        feats = {name: sampler.rows() for name, sampler in captured.items()}
        return {name: rows.relu() for name, rows in feats.items()} if self.activation == "relu" else feats

    def measure(self, pl_module: ObservedLearner, episode: list[Tensor]) -> dict[str, Tensor]:
        """All plasticity scalars of one probe pass, by logged name."""
        out: dict[str, Tensor] = {}
        weights = [p for p in pl_module.parameters() if p.ndim >= 2]
        if weights:
            out["plasticity/weight_magnitude"] = weight_magnitude(weights)
        feats = self.features(pl_module, episode)
        if not feats:
            if pl_module.probe_layers() and not self._warned:
                self._warned = True
                rank_zero_warn(f"{type(self).__name__}: no probe layer ran; override probe_layers() in the learner")
            return out
        dead = dormant = units = 0.0
        for name, acts in feats.items():
            d, z = dead_unit_fraction(acts), dormant_unit_fraction(acts, self.dormant_tau)
            sv = torch.linalg.svdvals(acts.to(torch.float64))
            out[f"plasticity/dead_frac/{name}"], out[f"plasticity/dormant_frac/{name}"] = d, z
            out[f"plasticity/eff_rank/{name}"] = entropy_effective_rank(sv)  # Roy–Vetterli on the same σ
            out[f"plasticity/srank/{name}"] = srank(sv, self.srank_delta).to(torch.float64)
            dead, dormant, units = dead + d * acts.shape[1], dormant + z * acts.shape[1], units + acts.shape[1]
        out["plasticity/dead_frac"], out["plasticity/dormant_frac"] = dead / units, dormant / units
        return out

    def setup(self, trainer: Trainer, pl_module: ObservedLearner, stage: str) -> None:
        """Check that the learner and the data module offer what the monitor calls."""
        require_contract(trainer, pl_module, type(self).__name__)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: ObservedLearner) -> None:
        """At the start of every n-th task: probe the current task and log."""
        task = due_task(trainer, self.every_n_tasks)
        if task is None:
            return
        values = self.measure(pl_module, probe_episode(trainer, pl_module, task, self.probe_size))
        release_free_heap()  # the probe pass's transient blocks would otherwise stay resident all run
        for name, value in values.items():
            pl_module.log(name, value.float(), on_step=False, on_epoch=True, batch_size=1)
