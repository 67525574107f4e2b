"""Replay memory and support-set sampling."""

from cl_lightning.memory.accounting import MemoryBytes, memory_bytes, row_bytes, stream_row_bytes
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
    "MemoryBytes",
    "ReplayBuffer",
    "draw_support",
    "memory_bytes",
    "pseudo_task_sample",
    "query_is_incoming",
    "row_bytes",
    "sample_support",
    "sliding_sample",
    "stream_row_bytes",
    "uniform_sample",
    "window_sample",
]
