"""Stochastic Lanczos quadrature (SLQ; Ubaru, Chen & Saad 2017; for neural-network Hessians Ghorbani, Krishnan & Xiao
2019 and PyHessian): the Hessian spectral density and effective rank of a large network.

The Lanczos runs are written here (full re-orthogonalisation in float64, tested against ``eigvalsh``): SLQ needs only
the tridiagonal coefficients of a few short runs, not a dependency such as ``curvlinops-for-pytorch``. The probes run
together through ``torch.vmap`` of the HVP, one Python-level step for all of them.
"""

from collections.abc import Callable

import torch
from torch import Tensor

from cl_lightning.metrics.hessian import hessian_spectrum


def _orthogonalise(w: Tensor, basis: Tensor) -> Tensor:
    """Removes from each w[b] (B, P) its components along basis[b] (B, j, P); twice ("twice is enough")."""
    for _ in range(2):
        w = w - torch.einsum("bjp,bj->bp", basis, torch.einsum("bjp,bp->bj", basis, w))  # (B, P)
    return w


def _lanczos(hvp: Callable[[Tensor], Tensor], v0: Tensor, steps: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Batched Lanczos with full re-orthogonalisation from start vectors v0 (B, P), in float64.

    Returns alpha (B, steps) and beta (B, steps − 1) on the CPU, the diagonals of T. The Krylov basis lives on the
    device the HVP returns. When a Krylov space closes (β ≈ 0) the run restarts from a random vector orthogonal to the
    basis and stores β = 0, so T splits into blocks and the extra nodes carry zero quadrature weight.
    """
    batched_hvp = torch.vmap(hvp)
    v = v0 / v0.norm(dim=1, keepdim=True)
    w = batched_hvp(v).detach().to(torch.float64)  # (B, P), on the HVP's device
    v = v.to(w.device)
    basis = torch.zeros(v0.shape[0], steps, v0.shape[1], dtype=torch.float64, device=w.device)  # (B, m, P)
    alphas, betas = [], []
    for j in range(steps):  # sequential: each Lanczos vector depends on the previous ones
        basis[:, j] = v
        if j > 0:
            w = batched_hvp(v).detach().to(torch.float64)
        alphas.append((w * v).sum(dim=1))
        if j == steps - 1:
            break
        hv_norm = w.norm(dim=1)
        w = _orthogonalise(w, basis[:, : j + 1])
        beta = w.norm(dim=1)
        closed = beta <= 1e-10 * hv_norm
        if bool(closed.any()):
            restart = torch.randn(w.shape, generator=gen, dtype=torch.float64).to(w.device)
            restart = _orthogonalise(restart, basis[:, : j + 1])
            w = torch.where(closed[:, None], restart / restart.norm(dim=1, keepdim=True), w)
            beta = torch.where(closed, 0.0, beta)
        betas.append(beta)
        v = w / torch.where(closed, 1.0, beta)[:, None]
    beta_out = torch.stack(betas, dim=1) if betas else torch.zeros(v0.shape[0], 0, dtype=torch.float64)
    return torch.stack(alphas, dim=1).cpu(), beta_out.cpu()


def slq_spectral_density(
    hvp: Callable[[Tensor], Tensor],
    n: int,
    num_probes: int = 16,
    num_steps: int = 64,
    seed: int = 0,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Hessian spectral density by stochastic Lanczos quadrature (Ubaru, Chen & Saad 2017; Ghorbani et al. 2019).

    For each Rademacher probe z (seeded), m = min(num_steps, P) Lanczos steps from z/‖z‖ give a tridiagonal T = U Θ Uᵀ;
    its Gauss quadrature has nodes θ_j and weights τ_j = U[0, j]² (Σ_j τ_j = 1), exact for polynomials of degree
    < 2m, so zᵀ f(H) z / P ≈ Σ_j τ_j f(θ_j). The density is the probe average
    φ(t) ≈ (1/num_probes) Σ_l Σ_j τ_j^(l) δ(t − θ_j^(l)), and tr f(H) ≈ P Σ w f(nodes). Its first moment is the
    Hutchinson estimate of tr(H)/P. Memory: chunk_size · m · P float64 values for the Lanczos basis, on the
    device of the HVP's output.

    Args:
        hvp: Hessian-vector product, e.g. from :func:`cl_lightning.metrics.make_hvp`; called through ``torch.vmap``
            on float64 vectors (CPU for the first call, then on the device it returns, where the basis is kept).
        n: number of parameters P.
        num_probes: number of Rademacher probe vectors.
        num_steps: Lanczos steps per probe.
        seed: seed of the probes (and of restart vectors).
        chunk_size: probes run together through ``torch.vmap`` (None: all); the weighted density does not depend
            on it (only zero-weight restart nodes can).

    Returns:
        ``(nodes, weights)``: float64 vectors of length num_probes · m; weights are ≥ 0 and sum to 1.

    >>> from cl_lightning.metrics.hessian import make_hvp
    >>> hvp = make_hvp(lambda t: (t * torch.tensor([1.0, 1.0, 4.0]) * t).sum() / 2, torch.zeros(3))
    >>> nodes, weights = slq_spectral_density(hvp, 3, num_probes=2)
    >>> round(float((weights * nodes).sum()), 6), round(float(weights.sum()), 6)  # tr(H)/P = 6/3
    (2.0, 1.0)
    """
    if num_probes < 1 or num_steps < 1:
        raise ValueError(f"num_probes and num_steps must be positive, got {num_probes}, {num_steps}")
    gen = torch.Generator().manual_seed(seed)
    probes = torch.randint(0, 2, (num_probes, n), generator=gen).to(torch.float64) * 2 - 1  # Rademacher ±1
    nodes, weights = [], []
    for chunk in probes.split(chunk_size or num_probes):
        alpha, beta = _lanczos(hvp, chunk, min(num_steps, n), gen)
        tri = torch.diag_embed(alpha) + torch.diag_embed(beta, 1) + torch.diag_embed(beta, -1)  # (B, m, m) T
        theta, vecs = torch.linalg.eigh(tri)
        nodes.append(theta.flatten())
        weights.append((vecs[:, 0, :] ** 2 / num_probes).flatten())
    return torch.cat(nodes), torch.cat(weights)


def slq_effective_rank(
    nodes: Tensor, weights: Tensor, n: int, jitter: float = 1e-6, clamp: float | None = 1e-12
) -> Tensor:
    """Estimate of :func:`cl_lightning.metrics.hessian_effective_rank` from an SLQ density, a float64 scalar.

    With s = :func:`cl_lightning.metrics.hessian_spectrum` (max(λ + jitter, clamp), or |λ + jitter|), the entropy
    effective rank is exp(ln S − E/S) with S = Σ_i s(λ_i) = tr s(H) and E = Σ_i s ln s = tr(s(H) ln s(H)), since
    −Σ p ln p = ln S − E/S for p = s/S. Both traces are SLQ spectral sums, S ≈ P Σ_j w_j s(θ_j) and
    E ≈ P Σ_j w_j s(θ_j) ln s(θ_j), so erank ≈ P · exp(ln s̄ − ē/s̄) with s̄, ē the weighted means: a ratio estimator
    (consistent as probes → ∞) with the probes' variance and the bias of Gauss quadrature at the kink of s at 0
    (docs/metrics.md §4). Compare values only at fixed (num_probes, num_steps, seed).

    Args:
        nodes: SLQ nodes from :func:`slq_spectral_density`.
        weights: matching weights (summing to 1).
        n: number of parameters P.
        jitter, clamp: as in :func:`cl_lightning.metrics.hessian_spectrum`.

    >>> round(slq_effective_rank(torch.tensor([0.0, 2.0]), torch.tensor([0.5, 0.5]), 4, jitter=0.0).item(), 4)
    2.0
    """
    s = hessian_spectrum(nodes, jitter, clamp)
    w = torch.as_tensor(weights).to(torch.float64)
    s_mean = (w * s).sum()
    if s_mean == 0:
        return torch.zeros((), dtype=torch.float64)
    e_mean = (w * torch.special.xlogy(s, s)).sum()  # xlogy: 0 ln 0 = 0
    return n * torch.exp(torch.log(s_mean) - e_mean / s_mean)
