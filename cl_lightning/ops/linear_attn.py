"""Linear (Hebbian) attention.

Katharopoulos et al. (2020), "Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention",
arXiv:2006.16236; the outer-product write is Schmidhuber's (1992) fast-weight programmer. Per head, with an optional
write strength beta_t:

    S_t = S_{t-1} + beta_t * k_t v_t^T        (S in R^{K x V})
    o_t = S_t^T q_t                           (prequential: o_t = S_{t-1}^T q_t)

Chunked form (chunk of C rows Q, K, V; V already scaled by beta):

    O_c = Q S + Tril(Q K^T) V                 (StrictTril when prequential)
    S  <- S + K^T V
"""

import torch
from torch import Tensor

from cl_lightning.ops.utils import causal_mask, chunk_scan, zero_state


def naive_recurrent_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    initial_state: Tensor | None = None,
    prequential: bool = False,
) -> tuple[Tensor, Tensor]:
    """Linear (Hebbian) attention, token-by-token reference: S_t = S_{t-1} + beta_t k_t v_t^T, o_t = S^T q_t.

    Args:
        q: Queries, shape (B, H, T, K); scale them (e.g. by K**-0.5) before the call if wanted.
        k: Keys, shape (B, H, T, K).
        v: Values, shape (B, H, T, V).
        beta: Write strengths beta_t, shape (B, H, T); None means 1.
        initial_state: State S_0, shape (B, H, K, V); None means zeros.
        prequential: If True, o_t = S_{t-1}^T q_t is read before step t's write (v_t never reaches o_t);
            otherwise o_t = S_t^T q_t (read after write).

    Returns:
        Outputs o of shape (B, H, T, V) and the final state S_T of shape (B, H, K, V), in the dtype of the inputs.
    """
    state = zero_state(q, v) if initial_state is None else initial_state
    if beta is not None:
        v = v * beta.unsqueeze(-1)
    outputs = []
    for t in range(q.shape[2]):  # sequential reference: one write per token
        if prequential:
            outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
        state = state + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, K, 1) * (B, H, 1, V)
        if not prequential:
            outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(outputs, dim=2), state


def chunk_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    initial_state: Tensor | None = None,
    prequential: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Linear (Hebbian) attention, chunked form: S_t = S_{t-1} + beta_t k_t v_t^T, o_t = S^T q_t.

    The same numbers as :func:`naive_recurrent_linear_attn`, the reference: arguments, shapes and returns as there.

    Args:
        chunk_size: Tokens per chunk C; any T works (the last chunk may be shorter).

    Example:
        >>> q, k, v = torch.randn(2, 3, 10, 4), torch.randn(2, 3, 10, 4), torch.randn(2, 3, 10, 5)
        >>> o, state = chunk_linear_attn(q, k, v, chunk_size=4)
        >>> tuple(o.shape), tuple(state.shape)
        ((2, 3, 10, 5), (2, 3, 4, 5))
    """
    state = zero_state(q, v) if initial_state is None else initial_state
    if beta is not None:
        v = v * beta.unsqueeze(-1)

    def step(q_c: Tensor, k_c: Tensor, v_c: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        mask = causal_mask(q_c.shape[2], prequential, q_c.device)
        scores = (q_c @ k_c.transpose(-1, -2)).masked_fill(~mask, 0.0)  # (B, H, C, C)
        return q_c @ state + scores @ v_c, state + k_c.transpose(-1, -2) @ v_c

    return chunk_scan(step, [q, k, v], state, chunk_size)
