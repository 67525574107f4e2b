"""A tiny synthetic classification stream for tests and smoke runs.

Gaussian blobs: class ``c`` is centred on a fixed random mean. Each task relabels the blobs (by default) and can
also permute the input dimensions (as Permuted MNIST permutes pixels). With relabelling, consecutive tasks
contradict each other on the same inputs: a network without memory must forget, while a learner that reads a
labelled context of the task need not.
"""

from __future__ import annotations

import torch

from cl_lightning.data.stream import TaskData, TaskStream, check_at_least, task_generator


class SyntheticClasses(TaskStream):
    """Permuted Gaussian blobs.

    Args:
        num_tasks: Tasks in the stream.
        num_classes: Classes (blobs).
        input_dim: Input features.
        train_size: Training examples per task.
        query_size: Held-out queries per task.
        chunk_size: Examples per training chunk.
        noise: Standard deviation of each blob around its mean (means have unit-variance entries).
        permute_labels: Give each task its own relabelling of the blobs.
        permute_inputs: Give each task its own permutation of the input dimensions.
        seed: Stream seed.
        warmup_tasks: The first tasks, trained on their held-out queries too and never evaluated.
    """

    task_type = "classification"

    def __init__(
        self,
        num_tasks: int = 3,
        num_classes: int = 4,
        input_dim: int = 8,
        train_size: int = 256,
        query_size: int = 64,
        chunk_size: int = 16,
        noise: float = 0.5,
        permute_labels: bool = True,
        permute_inputs: bool = False,
        seed: int = 0,
        warmup_tasks: int = 0,
    ) -> None:
        super().__init__(num_tasks, train_size, query_size, chunk_size, seed=seed, warmup_tasks=warmup_tasks)
        check_at_least(2, num_classes=num_classes)
        check_at_least(1, input_dim=input_dim)
        self.num_outputs = num_classes
        self.input_shape = (input_dim,)
        self.noise = noise
        self.permute_labels, self.permute_inputs = permute_labels, permute_inputs
        self.means = torch.randn(num_classes, input_dim, generator=task_generator(seed, 0, salt=99))

    def generate(self, task: int) -> TaskData:
        """Draw labelled blob samples and apply the task's input permutation."""
        gen = task_generator(self.seed, task)
        n = self.train_size + self.query_size
        y = torch.randint(0, self.num_outputs, (n,), generator=gen)
        x = self.means[y] + self.noise * torch.randn(n, self.input_shape[0], generator=gen)  # (n, D)
        if self.permute_inputs:
            x = x[:, torch.randperm(self.input_shape[0], generator=gen)]
        if self.permute_labels:
            y = torch.randperm(self.num_outputs, generator=gen)[y]
        k = self.train_size
        return TaskData(x[:k], y[:k], x[k:], y[k:])
