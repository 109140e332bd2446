"""One exception hierarchy; the CLI is the only place that catches it.

Exit codes (DESIGN.md): 2 usage or spec error, 3 no feasible plan or a solver failure.
"""


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""

    exit_code = 2


class SpecError(PlannerError):
    """A model, cluster, run or strategy specification is malformed or illegal."""

    exit_code = 2


class PlanFormatError(PlannerError):
    """A plan file does not follow its schema."""

    exit_code = 2


class InfeasibleError(PlannerError):
    """No strategy satisfies the request."""

    exit_code = 3


class SolverError(PlannerError):
    """A solver failed and left no plan."""

    exit_code = 3


class ExportError(PlannerError):
    """A plan cannot be written for a training runtime: the runtime lacks something the plan needs."""

    exit_code = 2
