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

from torch import Tensor

from cl_lightning.ops.utils import causal_mask, chunk_scan, recurrent_scan, zero_state


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
        q, v, initial_state, prequential: As for every matrix-state rule (:mod:`cl_lightning.ops`, also the returns).
        k: Keys, shape (B, H, T, K).
        beta: Write strengths beta_t, shape (B, H, T); None means 1.
    """
    state = zero_state(q, v) if initial_state is None else initial_state
    if beta is not None:
        v = v * beta.unsqueeze(-1)

    def write(t: int, state: Tensor) -> Tensor:  # one Hebbian write per token
        return state + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, K, 1) * (B, H, 1, V)

    return recurrent_scan(write, q, state, prequential)


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
        >>> import torch
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
