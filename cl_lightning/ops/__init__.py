"""Tensor functions for parametric (fast-weight, test-time-regression) attention rules.

Only the fast (chunked) forms and helpers are exported; each ``naive_recurrent_<op>`` reference lives next to its
``chunk_<op>`` in ``cl_lightning.ops.<module>``, and the chunked form's docstring names its reference.

The rules with a matrix state S (linear attention, decay, delta rule, gated delta rule, Longhorn, Omega) share their
conventions: queries ``q`` of shape (B, H, T, K) (scale them, e.g. by K**-0.5, before the call if wanted), keys of
the same shape, values ``v`` of shape (B, H, T, V); ``initial_state`` S_0 of shape (B, H, K, V), None meaning zeros;
with ``prequential`` the output o_t = S_{t-1}^T q_t is read before token t's update (decay and write), so v_t never
reaches o_t, otherwise o_t = S_t^T q_t. Each returns the outputs o of shape (B, H, T, V) and the final state S_T of
shape (B, H, K, V), in the dtype of the inputs.
"""

from cl_lightning.ops.decay import chunk_decay_linear_attn
from cl_lightning.ops.delta_rule import chunk_delta_rule
from cl_lightning.ops.feature_maps import feature_map
from cl_lightning.ops.gated_delta_rule import chunk_gated_delta_rule
from cl_lightning.ops.linear_attn import chunk_linear_attn
from cl_lightning.ops.longhorn import chunk_longhorn, longhorn_step_size
from cl_lightning.ops.omega import chunk_omega_rule
from cl_lightning.ops.titans import chunk_titans_linear
from cl_lightning.ops.ttt_linear import chunk_ttt_linear
from cl_lightning.ops.ttt_mlp import chunk_ttt_mlp
from cl_lightning.ops.utils import expand_pairs, l2_normalize, pair_outputs

__all__ = [
    "chunk_decay_linear_attn",
    "chunk_delta_rule",
    "chunk_gated_delta_rule",
    "chunk_linear_attn",
    "chunk_longhorn",
    "chunk_omega_rule",
    "chunk_titans_linear",
    "chunk_ttt_linear",
    "chunk_ttt_mlp",
    "expand_pairs",
    "feature_map",
    "l2_normalize",
    "longhorn_step_size",
    "pair_outputs",
]
