"""What crosses the package's parts (docs/architecture.md, "contract.py"): the stream's batch and episode types, the
evaluation log keys (their format lives here only) and what a callback may call on a learner or a data module.
It imports only ``torch`` and ``typing``, so ``data/``, ``learners/`` and ``callbacks/`` can all import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from torch import Tensor, nn

TaskType = Literal["classification", "regression"]
"""What the stream's targets are: class labels (scored by accuracy) or real vectors (scored by MSE)."""

QueryCount = int | Literal["eval"] | None
"""How many of a task's held-out queries an episode takes: a count, ``"eval"`` (the data module's ``eval_queries``,
what the built-in evaluation scores) or ``None`` (all)."""

SlotRole = Literal[
    "forward", "backward", "lag", "return", "revised", "stale", "matrix", "final", "validated", "written", "unseen"
]
"""Why an episode is evaluated: see :func:`metric_key`."""
_PLAIN_ROLES = ("forward", "backward", "revised", "stale", "written", "unseen")  # one key per metric and reading
_NUMBERED_ROLES = ("lag", "return", "matrix", "final", "validated")  # keys end in the slot's number
_FINAL_PREFIX = {"final": "test", "validated": "validate"}  # the final model's row, by the command that scores it


class StreamBatch(NamedTuple):
    """One chunk of the stream: ``x (B, *input_shape)``, ``y`` ((B,) long or (B, k) float), ``task_id (B,)``."""

    x: Tensor
    y: Tensor
    task_id: Tensor


class StreamSteps(NamedTuple):
    """``K`` consecutive chunks of the stream in one batch, learned one after another (one step each):
    ``x (K, B, *input_shape)``, ``y`` ((K, B) or (K, B, k)), ``task_id (K, B)``; ``K`` may be smaller at a task's
    end. The data module serves them with ``steps_per_batch > 1`` (one-point streams: fewer loop round trips)."""

    x: Tensor
    y: Tensor
    task_id: Tensor


def steps_in(batch: object) -> int:
    """Learner steps a training batch holds: ``K`` for :class:`StreamSteps`, else 1."""
    return batch.x.shape[0] if isinstance(batch, StreamSteps) else 1


class Episode(NamedTuple):
    """An evaluation episode: a labelled context from the task's training portion and held-out queries."""

    context_x: Tensor
    context_y: Tensor
    query_x: Tensor
    query_y: Tensor


class EvalSlot(NamedTuple):
    """One reason to evaluate an episode: its ``role`` and, for ``"matrix"`` and ``"final"``, the probe task, for
    ``"lag"`` the lag, for ``"return"`` the times the task's map was shown before."""

    role: SlotRole
    task: int = -1


class EvalBatch(NamedTuple):
    """One evaluation item: the episode of ``task`` and every slot its score is logged under."""

    episode: Episode
    task: int
    slots: tuple[EvalSlot, ...]


def metric_key(slot: EvalSlot, metric: str, reading: str | None = None) -> str:
    """The name an episode's score is logged under.

    ``metric`` is ``"acc"`` or ``"mse"``; ``reading`` names a further reading of the same episode (parametric
    attention's ``"live"``), which prefixes the metric (``forward_live_acc``).

    - ``"forward"``: ``eval/forward_{m}`` (the current task, after training it);
    - ``"backward"``: ``eval/backward_{m}`` (an earlier task; several lags log under one name and are averaged);
    - ``"lag"``: ``eval/backward_{m}/lag_{L}`` (task t − L, each lag under its own name: recall at several lags);
    - ``"return"``: ``eval/return_{m}/visit_{n}`` (on a stream whose maps recur, the next task's queries before it
      is shown: its map was shown ``n`` times before, 0 for a map not yet seen);
    - ``"revised"`` / ``"stale"``: ``eval/revised_{m}`` / ``eval/stale_{m}`` (on a stream that revises values, the
      current task's queries of the keys revised at this task, against the new value / the old one);
    - ``"matrix"``: ``eval/{m}_matrix/task_{j}`` (probe task ``j`` after a probe task: a cell of ``R``);
    - ``"final"`` / ``"validated"``: ``test/{m}/task_{j}`` / ``validate/{m}/task_{j}`` (probe task ``j`` scored by
      the final model, by the ``test`` / ``validate`` command: a checkpoint's row of ``R``);
    - ``"written"``: ``eval/written_{m}`` (the current task's written keys, clean: recall of what it wrote);
    - ``"unseen"``: ``eval/unseen_{m}`` (the current task's held-out keys of its rule, never written: the P1 probe).

    >>> metric_key(EvalSlot("matrix", 7), "acc", "live")
    'eval/live_acc_matrix/task_7'
    >>> metric_key(EvalSlot("forward"), "mse")
    'eval/forward_mse'
    >>> metric_key(EvalSlot("lag", 20), "acc", "live")
    'eval/backward_live_acc/lag_20'
    """
    m = metric if reading is None else f"{reading}_{metric}"
    if slot.role in _PLAIN_ROLES:
        return f"eval/{slot.role}_{m}"
    if slot.role == "lag":
        return f"eval/backward_{m}/lag_{slot.task}"
    if slot.role == "return":
        return f"eval/return_{m}/visit_{slot.task}"
    if slot.role == "matrix":
        return f"eval/{m}_matrix/task_{slot.task}"
    return f"{_FINAL_PREFIX[slot.role]}/{m}/task_{slot.task}"


def summary_key(slot: EvalSlot, metric: str, reading: str | None = None) -> str | None:
    """The name the mean of a final row's scores is logged under (``test/{m}`` / ``validate/{m}``: the final model's
    ACC over the probe tasks), for a ``"final"`` or ``"validated"`` slot; ``None`` for the others.

    >>> summary_key(EvalSlot("validated", 3), "acc"), summary_key(EvalSlot("forward"), "acc")
    ('validate/acc', None)
    """
    if slot.role not in _FINAL_PREFIX:
        return None
    return f"{_FINAL_PREFIX[slot.role]}/{metric if reading is None else f'{reading}_{metric}'}"


def parse_metric_key(key: str, metric: str, reading: str | None = None) -> EvalSlot | None:
    """The slot :func:`metric_key` made ``key`` from, or ``None`` (the inverse, for readers of logged runs).

    >>> parse_metric_key("eval/acc_matrix/task_12", "acc")
    EvalSlot(role='matrix', task=12)
    >>> parse_metric_key("eval/forward_live_acc", "acc") is None
    True
    >>> parse_metric_key("eval/backward_acc/lag_5", "acc")
    EvalSlot(role='lag', task=5)
    >>> parse_metric_key("eval/return_acc/visit_1", "acc")
    EvalSlot(role='return', task=1)
    """
    for role in _PLAIN_ROLES:
        if key == metric_key(EvalSlot(role), metric, reading):
            return EvalSlot(role)
    for role in _NUMBERED_ROLES:
        head = metric_key(EvalSlot(role, 0), metric, reading)[:-1]  # the key of task j is head + str(j)
        tail = key.removeprefix(head)
        if tail != key and tail.isdigit():
            return EvalSlot(role, int(tail))
    return None


def split_metric_key(key: str, metric: str) -> tuple[EvalSlot, str | None] | None:
    """The slot and the reading :func:`metric_key` made ``key`` from, whatever the reading, or ``None``.

    >>> split_metric_key("eval/forward_live_acc", "acc")
    (EvalSlot(role='forward', task=-1), 'live')
    >>> split_metric_key("eval/acc_matrix/task_3", "acc")
    (EvalSlot(role='matrix', task=3), None)
    >>> split_metric_key("eval/backward_live_acc/lag_1", "acc")
    (EvalSlot(role='lag', task=1), 'live')
    """
    slot = parse_metric_key(key, metric)
    if slot is not None:
        return slot, None
    for role in _PLAIN_ROLES + _NUMBERED_ROLES:
        # the key of reading r (and task 0) is head + r + tail: cut there, then check with parse_metric_key
        head, _, tail = metric_key(EvalSlot(role, 0), metric, "\0").partition("\0")
        tail = tail[:-1] if role in _NUMBERED_ROLES else tail  # the task's (lag's) digits vary
        rest = key.removeprefix(head)
        cut = rest.rfind(tail)
        if rest != key and cut > 0:
            reading = rest[:cut]
            slot = parse_metric_key(key, metric, reading)
            if slot is not None:
                return slot, reading
    return None


def online_key(metric: str) -> str:
    """The name the prequential (online) score is logged under: ``train/online_{metric}``, the per-task mean of
    the score of predictions made before learning from the chunk.

    >>> online_key("mse")
    'train/online_mse'
    """
    return f"train/online_{metric}"


@runtime_checkable
class ObservedLearner(Protocol):
    """What a callback may read or call on a learner (every ``ContinualLearner`` has all of it), besides the
    ``LightningModule`` members (``log``, ``parameters``, ``named_parameters``, ``modules``, ``device``)."""

    task_type: TaskType

    @property
    def metric_name(self) -> str:
        """``"acc"`` or ``"mse"``."""

    def predict_episode(self, context_x: Tensor, context_y: Tensor, query_x: Tensor) -> Tensor:
        """Predictions for ``query_x`` given a labelled context of the same task."""

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        """The training loss of predictions (differentiated by the Hessian monitor)."""

    def score(self, pred: Tensor, y: Tensor) -> Tensor:
        """Accuracy or MSE of predictions."""

    def probe_layers(self) -> dict[str, nn.Module]:
        """The hidden layers whose outputs the plasticity monitor records, by name."""

    def output_layer(self) -> nn.Module | None:
        """The read-out layer whose parameters the Hessian monitor differentiates by default (None: none)."""

    def context_memory_bytes(self) -> int:
        """Bytes of the learner's context memory (replay buffer, fast-weight state)."""


@runtime_checkable
class KeyedLearner(ObservedLearner, Protocol):
    """A learner that reads its memory along keys made from the input (``ParametricAttention``)."""

    def read_keys(self, x: Tensor) -> Tensor:
        """The unit keys the memory is read with for inputs ``x``: shape (H, N, K), per head (an example that makes
        several keys: their mean)."""


@runtime_checkable
class EpisodeSource(Protocol):
    """What a callback or a task-aware learner may ask of the data module (the ``StreamDataModule`` has all of it).

    Two numberings: epochs count every task of the stream (``num_tasks``, the first ``warmup_tasks`` of them
    warm-up tasks that are never evaluated); evaluation counts the evaluated tasks from 0 (``probe_tasks``,
    :meth:`episode`, the ``task_{j}`` of the log keys). :meth:`evaluated_task` maps an epoch to its evaluated task.
    """

    num_tasks: int
    warmup_tasks: int
    num_evaluated_tasks: int
    probe_tasks: list[int]
    eval_queries: int | None

    def evaluated_task(self, epoch: int) -> int | None:
        """The evaluated task trained in ``epoch`` (``epoch − warmup_tasks``), or ``None`` in a warm-up epoch."""

    def episode(self, task: int, num_queries: QueryCount = "eval") -> Episode:
        """Evaluated task ``task``'s episode with the data module's context size and the first ``num_queries``
        queries (``"eval"``: ``eval_queries``, what the built-in evaluation scores; ``None``: all)."""

    def queries(self, task: int, num_queries: QueryCount = "eval") -> tuple[Tensor, Tensor]:
        """Evaluated task ``task``'s first ``num_queries`` held-out queries and their targets (its episode's, without
        the context)."""

    def task_batches(self, task: int, max_examples: int | None = None) -> Iterator[StreamBatch]:
        """Epoch ``task``'s whole training portion (every rank's share) in arrival order, chunk by chunk."""


@runtime_checkable
class WrittenKeysSource(EpisodeSource, Protocol):
    """A data module whose stream writes keys (``AssociativeRecall``): the P1 probe's references read them."""

    num_outputs: int

    def written_episode(self, task: int) -> Episode:
        """Evaluated task ``task``'s written keys (clean) and their values as queries."""


def require(obj: Any, protocol: type, who: str) -> None:
    """Raise a ``TypeError`` naming what is missing when ``obj`` (a learner or data module handed to ``who``, the
    component that needs it) does not provide ``protocol``."""
    if isinstance(obj, protocol):
        return
    names = (*protocol.__annotations__, *(n for n in vars(protocol) if not n.startswith("_")))
    lacks = ", ".join(sorted(name for name in names if not hasattr(obj, name))) or "?"
    raise TypeError(f"{who} needs the {protocol.__name__} interface; {type(obj).__name__} lacks {lacks}")


def step_numbers(step_kernel: object) -> object:
    """What a learner's ``step_kernel`` means for its numbers: ``"torch"``, ``"autograd"``, ``"fused"`` and ``"auto"``
    (the same bits) read as ``"autograd"``, ``"native"`` as itself. A resume and a report's departures compare
    through it."""
    return "autograd" if step_kernel in ("torch", "fused", "auto") else step_kernel
