"""Hessian spectra of a training loss: exact for small blocks, Lanczos top-k, effective rank and srank.

Everything works on a loss of a *flat* parameter vector, ``loss_fn(theta) -> scalar`` with ``theta`` of shape (P,);
:func:`flat_loss` builds one from an ``nn.Module`` with ``torch.func.functional_call`` for any parameter block (one
layer, as in the QOA paper, or the whole network). Hessian-vector products are forward-over-reverse
(``torch.func.jvp`` of ``torch.func.grad``); nothing touches ``.grad`` or the module's train/eval mode.

* Exact, for P up to a few thousand: :func:`exact_hessian`, :func:`hvp_hessian`, :func:`exact_eigvals`; top-k:
  :func:`lanczos_eigvals`, called as :func:`exact_eigvals` is and in its order, so the two are interchangeable.
* Spectral density and an effective-rank estimate for large P: :mod:`cl_lightning.metrics.slq`.
"""

from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator, eigsh
from torch import Tensor, nn
from torch.func import functional_call, grad, hessian, jvp

from cl_lightning.metrics.effective_rank import entropy_effective_rank, srank

Which = Literal["LM", "LA", "SA"]
# sort keys: largest magnitude first, largest algebraic first, smallest algebraic first (SciPy's names)
_ORDER: dict[str, Callable[[Tensor], Tensor]] = {"LM": lambda e: -e.abs(), "LA": lambda e: -e, "SA": lambda e: e}


def flat_loss(
    model: nn.Module,
    loss: Callable[[Tensor, Tensor], Tensor],
    inputs: Tensor,
    targets: Tensor,
    param_names: list[str] | None = None,
) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """Loss on a fixed batch as a function of a flat vector of (some of) the model's parameters.

    Args:
        model: the network; evaluated with ``functional_call`` in its current mode (use eval mode for BatchNorm).
        loss: ``loss(model(inputs), targets) -> scalar``, e.g. ``torch.nn.functional.cross_entropy``.
        inputs: probe batch fed to the model.
        targets: probe targets.
        param_names: the parameter block (names from ``named_parameters``); default all parameters. Others are held
            fixed at their current values.

    Returns:
        ``(loss_fn, theta)``: ``loss_fn(theta (P,)) -> scalar`` and the current flat block ``theta`` (detached).
    """
    params = dict(model.named_parameters())
    names = list(params) if param_names is None else list(param_names)
    if missing := [n for n in names if n not in params]:
        raise ValueError(f"unknown parameter names: {missing}")
    shapes = [params[n].shape for n in names]
    fixed = {k: v.detach() for k, v in params.items() if k not in names} | dict(model.named_buffers())
    theta = torch.cat([params[n].detach().reshape(-1) for n in names])

    def loss_fn(flat: Tensor) -> Tensor:
        chunks = flat.split([s.numel() for s in shapes])
        block = {n: c.view(s) for n, c, s in zip(names, chunks, shapes, strict=True)}
        return loss(functional_call(model, {**fixed, **block}, (inputs,)), targets)

    return loss_fn, theta


def exact_hessian(loss_fn: Callable[[Tensor], Tensor], params: Tensor) -> Tensor:
    """Dense Hessian ∂²f/∂θ² by ``torch.func.hessian`` (forward-over-reverse), symmetrised: (H + Hᵀ)/2, (P, P) in
    ``params``' dtype.

    Args:
        loss_fn: scalar loss of a flat parameter vector.
        params: (P,) point at which to differentiate.

    >>> exact_hessian(lambda t: (t[0] * t[1]) ** 2, torch.tensor([1.0, 2.0], dtype=torch.float64))
    tensor([[8., 8.],
            [8., 2.]], dtype=torch.float64)
    """
    h = hessian(loss_fn)(params)
    return (h + h.T) / 2


def make_hvp(loss_fn: Callable[[Tensor], Tensor], params: Tensor) -> Callable[[Tensor], Tensor]:
    """Hessian-vector product v ↦ H v at ``params``, as the JVP of ``torch.func.grad(loss_fn)`` (forward-over-reverse).

    ``hvp(v (P,)) -> (P,)`` casts ``v`` to ``params``' dtype and device; the result stays there.

    Args:
        loss_fn: scalar loss of a flat parameter vector.
        params: (P,) point at which the Hessian is taken.

    >>> hvp = make_hvp(lambda t: (t**3).sum(), torch.tensor([1.0, 2.0]))
    >>> hvp(torch.tensor([1.0, 1.0]))
    tensor([ 6., 12.])
    """
    grad_fn = grad(loss_fn)

    def hvp(v: Tensor) -> Tensor:
        return jvp(grad_fn, (params,), (v.to(params),))[1]

    return hvp


def summed_hvp(parts: list[tuple[float, Callable[[Tensor], Tensor]]]) -> Callable[[Tensor], Tensor]:
    """v ↦ Σᵢ wᵢ Hᵢ v: the Hessian-vector product of a loss that is a weighted sum of parts, one part at a time.

    A mean loss over N examples split into chunks of nᵢ is Σᵢ (nᵢ/N) · (mean over chunk i), so its Hessian is the
    same weighted sum of the chunks' Hessians; each part's intermediates are freed before the next one runs, which
    bounds the memory of an HVP (vmapped over many tangents) by the largest chunk instead of the whole batch.

    Args:
        parts: ``(weight, hvp)`` pairs, each ``hvp`` from :func:`make_hvp` at the same point.

    >>> f = make_hvp(lambda t: (t**2).sum(), torch.tensor([1.0, 2.0]))
    >>> g = make_hvp(lambda t: (t**3).sum(), torch.tensor([1.0, 2.0]))
    >>> summed_hvp([(0.5, f), (0.5, g)])(torch.tensor([1.0, 1.0]))
    tensor([4., 7.])
    """
    if not parts:
        raise ValueError("summed_hvp needs at least one part")

    def hvp(v: Tensor) -> Tensor:
        return sum(weight * part(v) for weight, part in parts)

    return hvp


def hvp_hessian(hvp: Callable[[Tensor], Tensor], n: int, chunk_size: int | None = None) -> Tensor:
    """Dense Hessian from HVPs on the identity columns, vmapped in chunks of ``chunk_size``: (P, P) float64,
    symmetrised. With :func:`make_hvp` this is ``jacfwd(grad(f))``, the computation of ``torch.func.hessian``, in
    bounded memory.

    Args:
        hvp: Hessian-vector product from :func:`make_hvp`.
        n: number of parameters P.
        chunk_size: columns per vmapped batch (None: all at once).
    """
    eye = torch.eye(n, dtype=torch.float64)
    h = torch.vmap(hvp, chunk_size=chunk_size)(eye).to(torch.float64)  # row i = H e_i
    return (h + h.T) / 2


def _select(eigvals: Tensor, k: int | None, which: Which) -> Tensor:
    """The first k eigenvalues in ``which`` order (LM: |λ| descending, LA: descending, SA: ascending)."""
    order = torch.argsort(_ORDER[which](eigvals), stable=True)
    return eigvals[order][:k]


def exact_eigvals(
    hvp: Callable[[Tensor], Tensor], n: int, k: int | None = None, which: Which = "LM", chunk_size: int | None = None
) -> Tensor:
    """Eigenvalues of the dense Hessian by float64 ``torch.linalg.eigvalsh``, ``(k,)`` in ``which`` order (the
    reference for :func:`lanczos_eigvals`).

    Args:
        hvp: Hessian-vector product from :func:`make_hvp`.
        n: number of parameters P.
        k: how many to return (None: all P).
        which: ``"LM"`` largest |λ| first, ``"LA"`` largest first, ``"SA"`` smallest first.
        chunk_size: columns per vmapped HVP batch when building H.

    >>> hvp = make_hvp(lambda t: (t[0] ** 2 - 3 * t[1] ** 2) / 2, torch.zeros(2, dtype=torch.float64))
    >>> exact_eigvals(hvp, 2)
    tensor([-3.,  1.], dtype=torch.float64)
    """
    return _select(torch.linalg.eigvalsh(hvp_hessian(hvp, n, chunk_size)), k, which)


def lanczos_eigvals(
    hvp: Callable[[Tensor], Tensor], n: int, k: int = 6, which: Which = "LM", tol: float = 0.0, seed: int = 0
) -> Tensor:
    """Top-k Hessian eigenvalues by implicitly restarted Lanczos (SciPy ``eigsh``/ARPACK) on HVPs, float64 ``(k,)`` in
    the order of :func:`exact_eigvals`.

    Args:
        hvp: Hessian-vector product from :func:`make_hvp` (called on float64 CPU vectors).
        n: number of parameters P.
        k: number of eigenvalues, 0 < k < P.
        which: ``"LM"`` largest |λ|, ``"LA"`` largest algebraic, ``"SA"`` smallest algebraic.
        tol: ARPACK relative accuracy (0: machine precision).
        seed: seed of the Gaussian start vector (results are deterministic given it).

    >>> hvp = make_hvp(lambda t: (t * torch.arange(1.0, 6.0) * t).sum() / 2, torch.zeros(5))
    >>> [round(float(x), 6) for x in lanczos_eigvals(hvp, 5, k=2)]
    [5.0, 4.0]
    """
    if not 0 < k < n:
        raise ValueError(f"need 0 < k < n, got k={k}, n={n}")

    def matvec(v: np.ndarray) -> np.ndarray:
        out = hvp(torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64).reshape(-1)))
        return out.detach().to("cpu", torch.float64).numpy()

    op = LinearOperator((n, n), matvec=matvec, dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(n)
    vals = eigsh(op, k=k, which=which, tol=tol, v0=v0, return_eigenvectors=False)
    return _select(torch.from_numpy(np.asarray(vals, dtype=np.float64)), k, which)


def hessian_spectrum(eigvals: Tensor, jitter: float = 1e-6, clamp: float | None = 1e-12) -> Tensor:
    """The non-negative spectrum whose entropy gives the Hessian effective rank, float64 ``(P,)``.

    λ' = max(λ + jitter, clamp): the QOA code's eigenvalues of H + 1e-6·I clamped to ≥ 1e-12, which discards
    negative curvature. ``clamp=None`` gives |λ + jitter| instead (``jitter=0`` then is the plain |λ| convention).

    Args:
        eigvals: (P,) Hessian eigenvalues.
        jitter: added to every eigenvalue (H + jitter·I).
        clamp: lower bound after the shift, or None for the absolute value.

    >>> hessian_spectrum(torch.tensor([1.0, -2.0]), jitter=0.0, clamp=None)
    tensor([1., 2.], dtype=torch.float64)
    """
    shifted = torch.as_tensor(eigvals).to(torch.float64) + jitter
    return shifted.abs() if clamp is None else shifted.clamp_min(clamp)


def hessian_effective_rank(eigvals: Tensor, jitter: float = 1e-6, clamp: float | None = 1e-12) -> Tensor:
    """Entropy effective rank of a Hessian spectrum, as the QOA paper computes it (Roy & Vetterli 2007), float64.

    λ' = :func:`hessian_spectrum`, p = λ'/Σλ', erank = exp(−Σ p ln p) (docs/metrics.md §4).

    Args:
        eigvals, jitter, clamp: As in :func:`hessian_spectrum`.

    >>> round(hessian_effective_rank(torch.tensor([2.0, 2.0, -1.0])).item(), 4)
    2.0
    """
    return entropy_effective_rank(hessian_spectrum(eigvals, jitter, clamp))


def hessian_srank(eigvals: Tensor, delta: float = 0.01) -> Tensor:
    """srank_δ (Kumar et al. 2021) on |λ|: the smallest k whose largest |λ| hold a 1 − δ share of Σ|λ| (int64).

    Args:
        eigvals: (P,) Hessian eigenvalues.
        delta: share of Σ|λ| that may be left out.

    >>> hessian_srank(torch.tensor([-10.0, 5.0, 0.01])).item()
    2
    """
    return srank(torch.as_tensor(eigvals).to(torch.float64).abs(), delta)
