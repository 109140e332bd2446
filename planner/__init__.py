"""planner: auto-parallel planning for distributed deep-learning training.

Public API: load_model, load_cluster, estimate.
"""

__version__ = "0.1.0"


def load_model(ref: str):
    from planner.spec.model import load_model as _load
    return _load(ref)


def load_cluster(ref: str):
    from planner.spec.hardware import load_cluster as _load
    return _load(ref)


def estimate(model, cluster, setup, strategy, **kwargs):
    from planner.cost.step import estimate as _estimate
    return _estimate(model, cluster, setup, strategy, **kwargs)
