"""Linear (Hebbian) attention.

Katharopoulos et al. (2020), "Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention",
arXiv:2006.16236; the outer-product write is Schmidhuber's (1992) fast-weight programmer. Per head, with an optional
write strength beta_t:

    S_t = S_{t-1} + beta_t * k_t v_t^T        (S in R^{K x V})
    o_t = S_t^T q_t                           (prequential: o_t = S_{t-1}^T q_t)

It is decay linear attention (:mod:`cl_lightning.ops.decay`) with no decay, g = 0, and runs that rule's code and
chunked form.
"""

from torch import Tensor

from cl_lightning.ops.decay import chunk_decay_linear_attn, naive_recurrent_decay_linear_attn


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
    return naive_recurrent_decay_linear_attn(q, k, v, None, beta, initial_state, prequential)


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

    As :func:`naive_recurrent_linear_attn` (arguments, shapes, numbers); ``chunk_size`` C tokens a chunk, any T.

    Example:
        >>> import torch
        >>> q, k, v = torch.randn(2, 3, 10, 4), torch.randn(2, 3, 10, 4), torch.randn(2, 3, 10, 5)
        >>> o, state = chunk_linear_attn(q, k, v, chunk_size=4)
        >>> tuple(o.shape), tuple(state.shape)
        ((2, 3, 10, 5), (2, 3, 4, 5))
    """
    return chunk_decay_linear_attn(q, k, v, None, beta, initial_state, prequential, chunk_size)
