"""Replay memory and support-set sampling."""

from cl_lightning.memory.replay_buffer import ReplayBuffer
from cl_lightning.memory.support_sampler import (
    draw_support,
    pseudo_task_sample,
    query_is_incoming,
    sample_support,
    sliding_sample,
    uniform_sample,
    window_sample,
)

__all__ = [
    "ReplayBuffer",
    "draw_support",
    "pseudo_task_sample",
    "query_is_incoming",
    "sample_support",
    "sliding_sample",
    "uniform_sample",
    "window_sample",
]
