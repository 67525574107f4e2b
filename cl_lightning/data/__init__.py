"""Task streams (benchmarks) and the one data module."""

from cl_lightning.data.associative_recall import AssociativeRecall
from cl_lightning.data.datamodule import StreamDataModule
from cl_lightning.data.permuted_mnist import PermutedMNIST, RescaledPermutedMNIST
from cl_lightning.data.slowly_changing_regression import SlowlyChangingRegression
from cl_lightning.data.split_images import SplitImages, SplitMNIST, SplitTinyImageNet
from cl_lightning.data.stream import TaskData, TaskStream
from cl_lightning.data.synthetic import SyntheticClasses

__all__ = [
    "AssociativeRecall",
    "PermutedMNIST",
    "RescaledPermutedMNIST",
    "SlowlyChangingRegression",
    "SplitImages",
    "SplitMNIST",
    "SplitTinyImageNet",
    "StreamDataModule",
    "SyntheticClasses",
    "TaskData",
    "TaskStream",
]
