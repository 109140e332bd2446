"""The layer contexts of a search (tp, cp, ep, micro-batch, recompute mode and the group spans):
what the lower bounds read of the cost model's layer tables, as scalars and columns, and the
collectives' affine coefficients that price many candidates' messages at once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.cost import comm
from planner.cost.pipeline import even_chunks
from planner.cost.step import (
    LAYER_ROWS,
    busy_s,
    context_tables,
    layer_kind_index,
    layer_memory,
)
from planner.placement import Span
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import TrainingSetup


@dataclass(frozen=True, slots=True)
class Context:
    """What the bounds need of one layer context, from the cost model's own layer prices."""

    total_s: float
    """per micro-batch: every layer's compute, base-mode recompute and tp/cp/ep time, plus the ends"""
    comp_s: float
    dense: float
    expert: float
    saved_b: float
    saving: float
    rec_cost_s: float
    """least saved bytes and largest saving of a layer without recompute, least recompute time"""
    prefix: np.ndarray
    """the context's prefix sums, one row per PREFIX_ROWS name (cost/step.LayerTables, and per)"""
    ends: dict
    transient_bytes: float
    prefetch_bytes: float
    layer_s: float
    """the least stage time of one layer (the steps of prefix row 'per')"""
    major: tuple
    """the most numerous layer kind: (count, dense params, expert params, saved bytes, saving,
    stage time, full recompute time) of one such layer"""
    first_s: float
    last_s: float


def _stage_time(rows: dict):
    """A layer's stage time without the terms that need ZeRO, recompute counts or p2p
    (cost/step.busy_s with the base mode's recomputation; rows per kind, or their prefix sums)."""
    return busy_s(rows["comp"], rows["rec_b"], rows["tp"], rows["cp"], rows["ep"])


def major(K: dict, model: ModelSpec) -> tuple:
    """Context.major from the per-kind rows of cost/step's layer tables."""
    counts = np.bincount(layer_kind_index(model), minlength=len(K["params"]))
    k = int(np.argmax(counts))
    per = _stage_time(K)
    return (float(counts[k]), float(K["params"][k]), float(K["expert"][k]), float(K["saved_b"][k]),
            float(K["saved_b"][k] - K["saved_f"][k]), float(per[k]), float(K["rec_f"][k]))


class Registry:
    """The layer contexts priced so far for one model, cluster and setup shape, each with an id
    (in order of first use), and their columns stacked as they grow: every search of a sweep
    reads the contexts it shares with the others by id, with no Python pass over them. Also
    each context's layer memory (for the memory floors, before any context is priced)."""

    def __init__(self, model: ModelSpec, cluster: Cluster, shape: TrainingSetup):
        self.args, self.ids, self.contexts = (model, cluster, shape), {}, []
        self._columns: dict = {}
        self._memory: dict = {}
        self._prefix, self._stacked = np.zeros((0, len(PREFIX_ROWS), model.layers + 1)), 0

    def id(self, tp: int, cp: int, ep: int, mb: int, sp: bool, mode: str, spans: tuple) -> int:
        """The id of a layer context (priced on first use; `spans`: its tp, cp and ep spans)."""
        key = (tp, cp, ep, mb, sp, mode, spans)
        k = self.ids.get(key)
        if k is None:
            # priced before it is registered: a context whose pricing raises (a GPU without the
            # precision's peak) leaves the registry, which later searches share, as it was
            priced = context(*self.args, *key)
            k = self.ids[key] = len(self.contexts)
            self.contexts.append(priced)
        return k

    def memory(self, tp: int, cp: int, ep: int, mb: int, sp: bool, mode: str) -> tuple:
        """cost/step.layer_memory of a layer context (computed on first use)."""
        key = (tp, cp, ep, mb, sp, mode)
        found = self._memory.get(key)
        if found is None:
            model, _, shape = self.args
            found = self._memory[key] = layer_memory(model, shape, *key)
        return found

    def col(self, name: str) -> np.ndarray:
        """A Context field, or an entry of its `ends`, per id."""
        have = self._columns.get(name)
        done = 0 if have is None else len(have)
        if done < len(self.contexts):
            field = name in Context.__dataclass_fields__
            new = np.array([getattr(x, name) if field else x.ends[name] for x in self.contexts[done:]])
            self._columns[name] = have = new if have is None else np.concatenate([have, new])
        return np.zeros(0) if have is None else have

    def prefix(self, row: int) -> np.ndarray:
        """(ids, layers + 1) prefix sums of PREFIX_ROWS[row] (rows kept with room to grow)."""
        done, n = self._stacked, len(self.contexts)
        if done < n:
            if n > len(self._prefix):
                grown = np.empty((2 * n, *self._prefix.shape[1:]))
                grown[:done] = self._prefix[:done]
                self._prefix = grown
            self._prefix[done:n] = [x.prefix for x in self.contexts[done:]]
            self._stacked = n
        return self._prefix[:n, row]


@lru_cache(maxsize=16)
def registry(model: ModelSpec, cluster: Cluster, shape: TrainingSetup) -> Registry:
    return Registry(model, cluster, shape)


class Table:
    """The layer contexts of one search (ids into a Registry) as columns: a scalar per context,
    or its prefix sums as a matrix, each gathered once, on first use."""

    __slots__ = ("registry", "ids", "_columns", "_prefix")

    def __init__(self, reg: Registry, ids: np.ndarray):
        self.registry, self.ids, self._columns, self._prefix = reg, ids, {}, {}

    def col(self, name: str) -> np.ndarray:
        """A Context field, or an entry of its `ends`, per context."""
        if name not in self._columns:
            self._columns[name] = self.registry.col(name)[self.ids]
        return self._columns[name]

    def even_stage_s(self, c: np.ndarray, p: int, v: int, layers: int) -> np.ndarray:
        """(len(c), p): each stage's time under the even split of contexts c into p x v chunks,
        without the terms that need ZeRO, recompute counts or p2p ('per' over its chunks, the
        embedding's on the first stage, the head's on the last)."""
        per = self.prefix("per")[c]
        chunks, _ = even_chunks(layers, p, v)
        times = sum(per[:, b] - per[:, a] for a, b in chunks)
        times[:, 0] += self.col("first_s")[c]
        times[:, -1] += self.col("last_s")[c]
        return times

    def prefix(self, name: str) -> np.ndarray:
        """(contexts, layers + 1) prefix sums of a PREFIX_ROWS name (gathered on first use)."""
        if name not in self._prefix:
            self._prefix[name] = self.registry.prefix(PREFIX_ROWS.index(name))[self.ids]
        return self._prefix[name]


PREFIX_ROWS = ("per", *LAYER_ROWS)
"""the prefix sums a Context holds: 'per' (a layer's stage time without the terms that need
ZeRO, recompute counts or p2p) and cost/step's layer tables"""


def context(model: ModelSpec, cluster: Cluster, setup: TrainingSetup, tp: int, cp: int, ep: int, mb: int,
             sp: bool, mode: str, spans: tuple) -> Context:
    """What the bounds read of one layer context (Registry.id prices each once)."""
    tab = context_tables(model, cluster, setup, tp, cp, ep, mb, sp, mode, dict(zip(("tp", "cp", "ep"), spans)))
    P, E, K, L = tab.prefix, tab.ends, tab.kinds, model.layers
    per = _stage_time(P)
    return Context(
        total_s=float(per[L] + E["emb_comp"] + E["emb_tp"] + E["head_comp"] + E["head_tp"]),
        comp_s=float(P["comp"][L] + E["emb_comp"] + E["head_comp"]),
        dense=float(P["params"][L] + E["emb_params"] + E["head_params"]), expert=float(P["expert"][L]),
        saved_b=float(K["saved_b"].min()), saving=float((K["saved_b"] - K["saved_f"]).max()),
        rec_cost_s=float(K["rec_f"].min()), prefix=np.stack([per, *(P[k] for k in LAYER_ROWS)]), ends=E,
        transient_bytes=tab.transient_bytes, prefetch_bytes=tab.prefetch_bytes, layer_s=float(np.diff(per).min()),
        major=major(K, model),
        first_s=E["emb_comp"] + E["emb_tp"], last_s=E["head_comp"] + E["head_tp"])


KINDS = ("all_reduce", "reduce_scatter", "all_gather")


@lru_cache(maxsize=4096)
def layout_coef(edp: Span, dpcp: Span, cluster: Cluster) -> tuple:
    """comm.affine_s of each of KINDS over the dp*cp group and the expert data-parallel group
    of a layout: [kind][dpcp, edp] = (seconds per byte, fixed seconds)."""
    return tuple(tuple(comm.affine_s(kind, group, cluster) for group in (dpcp, edp)) for kind in KINDS)


def affine(coef: np.ndarray, lay: np.ndarray):
    """coll(kind, bytes, group) of cost/step's shared formulas for candidates on layouts `lay`,
    from each collective's affine coefficients (comm.affine_s); bytes shaped (candidates, ...)."""
    def coll(kind, n_bytes, group):
        n_bytes = np.asarray(n_bytes)
        k = coef[lay, KINDS.index(kind), 0 if group == "dpcp" else 1]
        extra = (1,) * (n_bytes.ndim - 1)
        return (k[:, 0].reshape(-1, *extra) * n_bytes + k[:, 1].reshape(-1, *extra)) * (n_bytes > 0)
    return coll
