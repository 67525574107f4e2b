"""Delta rule (DeltaNet): error-correcting fast-weight writes.

Schlag, Irie, Schmidhuber (2021), "Linear Transformers Are Secretly Fast Weight Programmers", arXiv:2102.11174;
Yang et al. (2024), "Parallelizing Linear Transformers with the Delta Rule over Sequence Length", arXiv:2406.06484.
One LMS (Widrow-Hoff) step with learning rate beta_t on 1/2 ||S^T k_t - v_t||^2:

    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T q_t                                        (prequential: o_t = S_{t-1}^T q_t)

Keys should be L2-normalised (``l2_normalize``) so beta in (0, 2) keeps the write stable. It is the gated delta rule
(:mod:`cl_lightning.ops.gated_delta_rule`) with no decay, g = 0, and runs that rule's code and chunked WY/UT form.
"""

from torch import Tensor

from cl_lightning.ops.gated_delta_rule import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule


def naive_recurrent_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    prequential: bool = False,
) -> tuple[Tensor, Tensor]:
    """Delta rule, token-by-token reference: S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, o_t = S^T q_t.

    Args:
        q, v, initial_state, prequential: As for every matrix-state rule (:mod:`cl_lightning.ops`, also the returns).
        k: Keys, shape (B, H, T, K); L2-normalise them (``l2_normalize``) for a stable write.
        beta: Learning rates beta_t, shape (B, H, T); in (0, 1) for a contractive write, (0, 2) is still stable.
    """
    return naive_recurrent_gated_delta_rule(q, k, v, beta, None, initial_state, prequential)


def chunk_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    prequential: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Delta rule, chunked WY/UT form: S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, o_t = S^T q_t.

    As :func:`naive_recurrent_delta_rule` (arguments, shapes, numbers); ``chunk_size`` C tokens a chunk, any T.

    Example:
        >>> import torch
        >>> from cl_lightning.ops.utils import l2_normalize
        >>> k = l2_normalize(torch.randn(1, 1, 5, 4, dtype=torch.float64), eps=0.0)  # unit keys: exact writes
        >>> v = torch.randn(1, 1, 5, 3, dtype=torch.float64)
        >>> o, state = chunk_delta_rule(k, k, v, torch.ones(1, 1, 5, dtype=torch.float64), chunk_size=2)
        >>> torch.allclose(o, v)  # beta = 1 and q = k: each value is read back right after its write
        True
    """
    return chunk_gated_delta_rule(q, k, v, beta, None, initial_state, prequential, chunk_size)
