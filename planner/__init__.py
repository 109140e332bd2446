"""planner: auto-parallel planning for distributed deep-learning training.

Public API: load_model, load_cluster, estimate, make_plan (DESIGN.md's `plan`; that name is the
planner.plan module, which importing it would shadow).
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


def make_plan(model, cluster, gpus: int, global_batch: int, seq_len: int | None = None, precision: str = "bf16",
         attention: str = "flash", runtime: str = "supported", constraints: dict | None = None, **kwargs) -> dict:
    """The planner.plan/v2 document of the best strategy (what `planner plan --json` prints)."""
    from planner import planning
    return planning.make_plan(model, cluster, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
                     precision=precision, attention=attention, runtime=runtime, constraints=constraints or {},
                     **kwargs)
