"""Lightning callbacks that observe a run and log what they see."""

from cl_lightning.callbacks.progress import TaskProgressBar

__all__ = ["TaskProgressBar"]
