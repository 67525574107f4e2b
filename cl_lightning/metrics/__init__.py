"""Pure metric functions: accuracy-matrix CL metrics, representation ranks, dead units, Hessian spectra and the P1
probe's references."""

from cl_lightning.metrics.dead_units import dead_unit_fraction, dormant_unit_fraction, weight_magnitude
from cl_lightning.metrics.effective_rank import effective_rank, entropy_effective_rank, srank
from cl_lightning.metrics.forgetting import (
    average_accuracy,
    backward_transfer,
    forgetting,
    forward_transfer,
    intransigence,
    window_means,
)
from cl_lightning.metrics.hessian import (
    exact_eigvals,
    exact_hessian,
    flat_loss,
    hessian_effective_rank,
    hessian_spectrum,
    hessian_srank,
    hvp_hessian,
    lanczos_eigvals,
    make_hvp,
    summed_hvp,
)
from cl_lightning.metrics.rule_reference import least_squares_accuracy, nearest_pair_accuracy
from cl_lightning.metrics.slq import slq_effective_rank, slq_spectral_density

__all__ = [
    "average_accuracy",
    "backward_transfer",
    "dead_unit_fraction",
    "dormant_unit_fraction",
    "effective_rank",
    "entropy_effective_rank",
    "exact_eigvals",
    "exact_hessian",
    "flat_loss",
    "forgetting",
    "forward_transfer",
    "hessian_effective_rank",
    "hessian_spectrum",
    "hessian_srank",
    "hvp_hessian",
    "intransigence",
    "lanczos_eigvals",
    "least_squares_accuracy",
    "make_hvp",
    "nearest_pair_accuracy",
    "slq_effective_rank",
    "slq_spectral_density",
    "srank",
    "summed_hvp",
    "weight_magnitude",
    "window_means",
]
