"""Explainable AI (chapter 16): attributions on the engine, each with its cost.

Gradient methods differentiate through ``ml.grad``; perturbation methods only run the model;
every explainer returns an :class:`Explanation` holding the map and the model evaluations it
cost. ``README.md`` maps each method to its module and the book's section.
"""

from .cam import grad_cam, split_at, upsample
from .concepts import TCAVResult, concept_activation_vector, t_test, tcav, tcav_score
from .core import CountedModel, Explanation
from .gradients import (
    gradient_x_input,
    integrated_gradients,
    integrated_gradients_to_tolerance,
    path_rule,
    saliency,
    smoothgrad,
)
from .lime import lime_tabular, weighted_ridge
from .perturbation import occlusion, rise, rise_masks
from .sanity import cascading_randomisation, randomised, spearman
from .shapley import (
    CoalitionGame,
    all_coalitions,
    exact_shapley,
    kernel_shap,
    kernel_shap_solve,
    shapley_kernel,
)

__all__ = [
    "CoalitionGame", "CountedModel", "Explanation", "TCAVResult", "all_coalitions",
    "cascading_randomisation", "concept_activation_vector", "exact_shapley", "grad_cam",
    "gradient_x_input", "integrated_gradients", "integrated_gradients_to_tolerance",
    "kernel_shap", "kernel_shap_solve",
    "lime_tabular", "occlusion", "path_rule", "randomised", "rise", "rise_masks", "saliency",
    "shapley_kernel", "smoothgrad", "spearman", "split_at", "t_test", "tcav", "tcav_score",
    "upsample", "weighted_ridge",
]
