"""Replay memory and support-set sampling."""

from cl_lightning.memory.replay_buffer import ReplayBuffer
from cl_lightning.memory.support_sampler import (
    pseudo_task_sample,
    sample_support,
    sliding_sample,
    uniform_sample,
    window_sample,
)

__all__ = ["ReplayBuffer", "pseudo_task_sample", "sample_support", "sliding_sample", "uniform_sample", "window_sample"]
