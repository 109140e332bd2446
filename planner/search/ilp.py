"""Integer programmes for coupled discrete choices: solved exactly by their structure where it
allows (`--solver exact`, the default, below), or in process by HiGHS (highspy, the model built as
arrays) or by CBC through pulp (`--solver cbc`, a subprocess per solve), one model in two forms.

recompute_ilp: how many layers of each pipeline stage recompute fully. With x[i, r] = 1 when
stage i recomputes r layers (one-hot per stage; r ranging over the values that fit in memory),
    minimise  (m - 1/v) * T + (1/v) * sum_i sum_r x[i,r] t_i(r) + U
    s.t.      T >= sum_r x[i,r] t_i(r),  U >= sum_r x[i,r] tail_i(r)   for every stage i,
the cost model's step time (cost/pipeline.py). The stages couple through T and U: recomputing
more on a stage that is not the bottleneck lengthens its backward, which hides more of its
data-parallel reduction (a lower tail), at the price of sum t / v; choosing each stage's
cheapest feasible r on its own misses that. With one count (Megatron: one recompute-num-layers
for every stage) stage i takes min(R, n_i) for one R: a choice of one integer, so every R is
priced at once and the least taken (uniform_best: exact, no solver).

The model has a structure that solves it exactly without a solver (solver 'exact', the
default; _recompute_exact): once the largest tail U is fixed, every stage is best off with its
least t among its options of tail <= U, which lowers max t and sum t at once. The optimum's own
largest tail is one of the options' tails, and there that choice is no worse than the optimum;
so the least objective over the distinct tails is the optimum. HiGHS and CBC solve the same
model as an ILP (`--solver highs|cbc`), within their tolerances and time limit.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np

from planner.cost.pipeline import step_time_s, step_times_s
from planner.errors import SolverError

SOLVERS = ("exact", "highs", "cbc")


@dataclass(frozen=True, slots=True)
class IlpResult:
    recompute_layers: tuple[int, ...]
    objective: float
    optimal: bool
    """False when the time limit stopped the solver before it proved optimality"""
    shortcut: bool = False
    """True when no solve was needed (the least feasible counts are provably optimal)"""


@contextlib.contextmanager
def _quiet_stdout():
    """Solvers may print banners on file descriptor 1; stdout belongs to the JSON document."""
    fd = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(fd, 1)
        os.close(fd)


def _solve_cbc(prob, time_limit_s: float) -> tuple[dict, bool]:
    """Values of a pulp model's variables by CBC (a subprocess), and whether they are proven optimal."""
    import pulp

    with _quiet_stdout():
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s))
    if pulp.LpStatus[status] not in ("Optimal", "Not Solved") or prob.sol_status not in (1, 2):
        raise SolverError(f"CBC found no solution (status {pulp.LpStatus[status]})")
    return {v.name: v.value() for v in prob.variables()}, prob.sol_status == 1


def recompute_ilp(options: list[dict[int, tuple[float, float]]], microbatches: int, vpp: int,
                  solver: str = "exact", time_limit_s: float = 10.0) -> IlpResult | None:
    """options[i][r] = (t_i(r), tail_i(r)) for every r that fits stage i; None if a stage has none.
    `time_limit_s` bounds the HiGHS and CBC solves (the exact one has no limit to reach)."""
    if any(not o for o in options):
        return None
    if solver not in SOLVERS:
        raise SolverError(f"unknown solver {solver!r} (choose {', '.join(SOLVERS)})")
    if solver == "exact":
        chosen = _recompute_exact(options, microbatches, vpp)
        return IlpResult(recompute_layers=chosen, objective=_objective(options, chosen, microbatches, vpp),
                         optimal=True)
    if solver == "highs":
        chosen, optimal = _recompute_highs(options, microbatches, vpp, time_limit_s)
        return IlpResult(recompute_layers=chosen, objective=_objective(options, chosen, microbatches, vpp),
                         optimal=optimal)
    import pulp  # the CBC form only: importing it costs more than a HiGHS solve

    prob = pulp.LpProblem("recompute", pulp.LpMinimize)
    T = pulp.LpVariable("T", lowBound=0)
    U = pulp.LpVariable("U", lowBound=0)
    x = {(i, r): pulp.LpVariable(f"x_{i}_{r}", cat=pulp.LpBinary) for i, o in enumerate(options) for r in o}
    prob += (microbatches - 1.0 / vpp) * T + U + (1.0 / vpp) * pulp.lpSum(
        x[i, r] * o[r][0] for i, o in enumerate(options) for r in o)
    for i, o in enumerate(options):
        prob += pulp.lpSum(x[i, r] for r in o) == 1, f"one_r_{i}"
        prob += T >= pulp.lpSum(x[i, r] * o[r][0] for r in o), f"bottleneck_{i}"
        prob += U >= pulp.lpSum(x[i, r] * o[r][1] for r in o), f"tail_{i}"
    values, optimal = _solve_cbc(prob, time_limit_s)
    chosen = tuple(max((r for r in o if values[x[i, r].name] > 0.5), default=min(o)) for i, o in enumerate(options))
    return IlpResult(recompute_layers=chosen, objective=_objective(options, chosen, microbatches, vpp),
                     optimal=optimal)


def _recompute_exact(options, microbatches: int, vpp: int) -> tuple[int, ...]:
    """recompute_ilp's optimum by its structure (the module's docstring): for every distinct tail
    U, each stage's least t among its options of tail <= U (ties to the smaller tail, then the
    smaller count), priced as the objective; the counts of the least, the smallest U among
    equals. A stage's options sorted by (tail, count) make 'tail <= U' a prefix, whose least t
    is a running minimum: O(stages x options) per U, all U at once."""
    per_stage = []
    for o in options:
        rs = sorted(o, key=lambda r: (o[r][1], r))
        t = np.array([o[r][0] for r in rs])
        tail = np.array([o[r][1] for r in rs])
        least = np.minimum.accumulate(t)
        improves = np.concatenate([[True], t[1:] < least[:-1]])
        at = np.maximum.accumulate(np.where(improves, np.arange(len(rs)), 0))  # where each prefix's least is
        per_stage.append((np.array(rs), tail, least, at))
    U = np.unique(np.concatenate([tail for _, tail, _, _ in per_stage]))
    # stage i under each U: how many of its options have tail <= U (0: none, U infeasible)
    allowed = np.stack([np.searchsorted(tail, U, side="right") for _, tail, _, _ in per_stage])  # (stages, U)
    feasible = (allowed > 0).all(axis=0)
    U, allowed = U[feasible], allowed[:, feasible] - 1
    pick = np.stack([at[k] for (_, _, _, at), k in zip(per_stage, allowed)])  # option index, (stages, U)
    t = np.stack([least[k] for (_, _, least, _), k in zip(per_stage, allowed)])
    tail = np.stack([tl[p] for (_, tl, _, _), p in zip(per_stage, pick)])
    best = int(np.argmin(step_times_s(t.T, tail.T, microbatches, vpp)))
    return tuple(int(rs[p[best]]) for (rs, _, _, _), p in zip(per_stage, pick))


def _recompute_highs(options, microbatches: int, vpp: int, time_limit_s: float):
    """recompute_ilp's model (the same variables and rows as its pulp form, built as arrays) solved
    by HiGHS in process: (chosen counts, proven optimal)."""
    import highspy

    cols = [(i, r) for i, o in enumerate(options) for r in o]
    col = {c: 2 + k for k, c in enumerate(cols)}  # 0: T, 1: U, then x[i, r]
    n = 2 + len(cols)
    cost = np.zeros(n)
    cost[0], cost[1] = microbatches - 1.0 / vpp, 1.0
    for (i, r), k in col.items():
        cost[k] = options[i][r][0] / vpp
    rows: list[tuple[list[int], list[float], float, float]] = []
    for i, o in enumerate(options):
        ks = [col[i, r] for r in o]
        rows.append((ks, [1.0] * len(ks), 1.0, 1.0))  # one r per stage
        rows.append(([0, *ks], [1.0, *(-o[r][0] for r in o)], 0.0, np.inf))  # T >= t_i
        rows.append(([1, *ks], [1.0, *(-o[r][1] for r in o)], 0.0, np.inf))  # U >= tail_i
    with _quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    inf = h.getInfinity()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, len(rows)
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.array([inf, inf] + [1.0] * (n - 2))
    lp.row_lower_ = np.array([lo for _, _, lo, _ in rows], dtype=float)
    lp.row_upper_ = np.array([inf if hi == np.inf else hi for _, _, _, hi in rows], dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.cumsum([0] + [len(ks) for ks, _, _, _ in rows]).astype(np.int32)
    lp.a_matrix_.index_ = np.array([k for ks, _, _, _ in rows for k in ks], dtype=np.int32)
    lp.a_matrix_.value_ = np.array([v for _, vals, _, _ in rows for v in vals], dtype=float)
    lp.integrality_ = [highspy.HighsVarType.kContinuous] * 2 + [highspy.HighsVarType.kInteger] * (n - 2)
    h.passModel(lp)
    with _quiet_stdout():
        h.run()
    if h.getInfo().primal_solution_status != 2:  # 2: a feasible solution
        raise SolverError(f"HiGHS found no solution ({h.modelStatusToString(h.getModelStatus())})")
    x = h.getSolution().col_value
    chosen = tuple(max((r for r in o if x[col[i, r]] > 0.5), default=min(o)) for i, o in enumerate(options))
    return chosen, h.getModelStatus() == highspy.HighsModelStatus.kOptimal


def uniform_best(times, tails, allowed, microbatches: int, vpp: int, uniform) -> IlpResult | None:
    """The one R (stage i recomputing min(R, n_i) layers, each an allowed count) of least step
    time, the least R among equals; None when no R is allowed on every stage. `times`, `tails`
    and `allowed` are (stages, counts) arrays; every R at once, each step as step_time_s
    computes it (the stages summed in order)."""
    stages = np.arange(len(uniform))[None, :]
    chosen = np.minimum(np.arange(max(uniform) + 1)[:, None], np.asarray(uniform)[None, :])  # (R, stages)
    ok = np.asarray(allowed)[stages, chosen].all(axis=1)
    if not ok.any():
        return None
    t, tail = np.asarray(times)[stages, chosen], np.asarray(tails)[stages, chosen]
    steps = np.where(ok, step_times_s(t, tail, microbatches, vpp), np.inf)  # a count not allowed: not taken
    best = int(np.argmin(steps))  # the least R among equals
    return IlpResult(recompute_layers=tuple(int(r) for r in chosen[best]), objective=float(steps[best]), optimal=True)


def _objective(options, chosen, microbatches: int, vpp: int) -> float:
    times = [options[i][r][0] for i, r in enumerate(chosen)]
    tails = [options[i][r][1] for i, r in enumerate(chosen)]
    return step_time_s(times, tails, microbatches, vpp)
