"""Replay memory and support-set sampling."""

from cl_lightning.memory.replay_buffer import ReplayBuffer
from cl_lightning.memory.support_sampler import sample_support, uniform_sample, window_sample

__all__ = ["ReplayBuffer", "sample_support", "uniform_sample", "window_sample"]
