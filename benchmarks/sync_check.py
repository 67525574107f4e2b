"""Find the host-device synchronisations of training steps on a CPU-only machine.

On an accelerator the host waits for the device whenever it needs a value computed there: ``.item()``, ``int()``,
``bool()``, ``.tolist()``, ``.cpu()``, boolean-mask indexing, ``nonzero``, ``unique``, ``masked_select``, and a
blocking copy from pageable host memory to the device. On the CPU none of these waits, and every tensor is on the
same device, so a run cannot show them directly. :class:`SyncRecorder` tells device data from host data by
*taint*: the learner's parameters and buffers, the training batch as it arrives on the device, and tensors made
with an explicit ``device=`` (other than the string ``"cpu"``) are device tensors; whatever an operation computes
from a device tensor is one too (in-place and ``out=`` targets included). An operation that reads a device
tensor's value on the host, or a blocking host-to-device copy, is recorded with the innermost frame of the package
that issued it.

What it cannot see: host tensors made with ``device=<the CPU>`` count as device tensors (conservative), and a
``.to(device)`` of a device tensor is taken as a move within the device. ``F.one_hot`` with ``num_classes`` reads
the labels' minimum and maximum on the CPU only (on CUDA device asserts check them): its reads are not recorded.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

aten = torch.ops.aten
#: aten operations that read a tensor's values on the host (or whose output size depends on them)
READS = {
    aten._local_scalar_dense.default,
    aten.item.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten._unique.default,
    aten._unique2.default,
    aten.repeat_interleave.Tensor,
}
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.rand, torch.randn, torch.randint}
COPIES_IN = {torch.tensor, torch.as_tensor}  # from Python data: a blocking copy when the device is an accelerator
HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}
ROOT = str(Path(__file__).resolve().parents[1] / "cl_lightning")

#: Where a read may happen, why it does not cost a wait per step on an accelerator, and how often it may happen.
PER_STEP_ON_CPU_ONLY = {
    "divergence.py:on_train_batch_end": "DivergenceStop reads the loss on the CPU only (~2 us); on an accelerator "
    "it folds the loss's finiteness into a device flag read every 100 steps (its docstring)",
}
PER_TASK = {  # at most MAX_PER_TASK events per task each
    "task_mean.py:task_mean": "a task mean's two states are made on the host and moved when the task's first value "
    "of that name arrives",
    "utilities/data.py:has_len_all_ranks": "Lightning checks the reloaded training loader's length (each task)",
}
MAX_PER_TASK = 8


@dataclass
class Event:
    """One synchronisation: what, and where in the package (``file.py:function``, or ``?`` outside it)."""

    what: str
    where: str


def _where() -> str:
    stack = traceback.extract_stack()[:-3]
    for frame in reversed(stack):
        if frame.filename.startswith(ROOT):
            return f"{Path(frame.filename).name}:{frame.name}"
    for frame in reversed(stack):  # outside the package: the innermost frame outside torch and this file
        if "/torch/" not in frame.filename and not frame.filename.endswith("sync_check.py"):
            return f"{Path(frame.filename).parent.name}/{Path(frame.filename).name}:{frame.name}"
    return "?"


@dataclass
class SyncRecorder:
    """Taint tracking of device tensors and the record of host reads of them (see the module docstring)."""

    active: bool = False
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.device = WeakTensorKeyDictionary()

    def mark(self, *tensors: Any) -> None:
        """Declare tensors (nested in lists, tuples, dicts, named tuples) device tensors."""
        for t in tree_flatten(list(tensors))[0]:
            if isinstance(t, torch.Tensor):
                self.device[t] = True

    def is_device(self, value: Any) -> bool:
        """Whether any tensor in ``value`` is a device tensor."""
        return any(isinstance(t, torch.Tensor) and t in self.device for t in tree_flatten(value)[0])

    def record(self, what: str) -> None:
        """Add an event (while :attr:`active`)."""
        if self.active:
            self.events.append(Event(what, _where()))


class _Recording:
    """Base of the two torch modes below: each reports to one :class:`SyncRecorder`."""

    def __init__(self, rec: SyncRecorder) -> None:
        super().__init__()  # the torch mode's own __init__, next in the MRO
        self.rec = rec


class _Dispatch(_Recording, TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.rec.is_device((args, kwargs)):
            if func in READS:
                self.rec.record(str(func.overloadpacket.__name__))
            elif func.overloadpacket in (aten.index, aten.index_put, aten.index_put_):
                indices = args[1] if len(args) > 1 else kwargs.get("indices", [])
                if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                    self.rec.record(f"{func.overloadpacket.__name__} with a boolean mask")
            self.rec.mark(out, *[a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)])
        return out


class _Function(_Recording, TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.one_hot and (len(args) > 1 or "num_classes" in kwargs):
            # with num_classes given, CUDA's one_hot checks the labels by device asserts; only the CPU reads them
            active, self.rec.active = self.rec.active, False
            try:
                out = func(*args, **kwargs)
            finally:
                self.rec.active = active
            if self.rec.is_device(args):
                self.rec.mark(out)
            return out
        out = func(*args, **kwargs)
        device = kwargs.get("device")
        on_device = device is not None and not (isinstance(device, str) and device.startswith("cpu"))
        if func in FACTORIES and on_device:
            self.rec.mark(out)
        elif func in COPIES_IN and on_device:
            self.rec.record(f"torch.{func.__name__}(..., device=) (blocking copy to the device)")
            self.rec.mark(out)
        elif func in HOST_READS and self.rec.is_device(args[0]):
            self.rec.record(f"Tensor.{func.__name__}")
        elif func is torch.Tensor.to and args:
            target = [a for a in (*args[1:], kwargs.get("device")) if isinstance(a, (torch.device, str))]
            if target and isinstance(target[0], str) and target[0].startswith("cpu") and self.rec.is_device(args[0]):
                self.rec.record("Tensor.to('cpu')")
            elif target and not self.rec.is_device(args[0]):  # host -> device
                if not kwargs.get("non_blocking", False):
                    self.rec.record("Tensor.to(device) of a host tensor, blocking")
                self.rec.mark(out)
        return out


class SyncWatch(Callback):
    """Record the synchronisations of training steps after ``warmup`` steps, until each task's end.

    The batch's move to the device is replaced by a copy, whose tensors are device tensors; the batch the data
    loader made (what ``on_before_batch_transfer`` sees) stays host data, as it is on an accelerator.
    """

    def __init__(self, warmup: int) -> None:
        self.warmup, self.rec, self.batches, self.steps = warmup, SyncRecorder(), 0, 0
        self._modes: tuple[TorchDispatchMode, TorchFunctionMode] | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Mark the learner's state as device data and start watching."""
        self.rec.mark(list(pl_module.parameters()), list(pl_module.buffers()))

        def to_device(batch: Any, device: torch.device, dataloader_idx: int) -> Any:
            moved = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, batch)
            self.rec.mark(moved)
            return type(batch)(*moved) if isinstance(batch, tuple) and hasattr(batch, "_fields") else moved

        pl_module.transfer_batch_to_device = to_device  # type: ignore[method-assign]
        self._modes = (_Function(self.rec), _Dispatch(self.rec))
        for mode in self._modes:
            mode.__enter__()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Stop watching."""
        if self._modes is not None:
            for mode in reversed(self._modes):
                mode.__exit__(None, None, None)
            self._modes = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Start recording once the warm-up steps are done."""
        self.batches += 1
        self.rec.active = self.batches > self.warmup
        self.steps += self.rec.active

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The task's evaluation is not a training step."""
        self.rec.active = False

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The task's end: its once-per-task reads (metrics, checks) are not per step."""
        self.rec.active = False
