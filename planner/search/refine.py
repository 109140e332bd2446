"""Refined bounds of a batch of candidates (search/driver.py asks in bound order): floors of the
largest tail, the least bottleneck a split can have under memory, the least recomputation, and
whether any split fits at all (module docstring of search/bounds.py lists the arguments)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from planner.cost import memory
from planner.cost.pipeline import even_chunks, in_flight
from planner.cost.step import (dp_grad_bytes, gather_bytes, gathered_bytes, optimizer_state_bytes, stage_ends,
                               stage_memory, stage_tail_s)
from planner.search import space
from planner.search.contexts import Table, affine
from planner.search.floors import SAFETY, layer_state_bytes, pipeline_floor_s
from planner.spec.hardware import Cluster
from planner.spec.model import ModelSpec
from planner.spec.training import TrainingSetup

SLICE = 256
"""candidates whose per-range memory tables are built at once (bounds the arrays' size)"""
BISECTIONS = 30
"""halvings of a bisected bound (its lower end is kept: valid however many)"""


@dataclass(frozen=True, slots=True)
class Refiner:
    """What refinement needs of every candidate (in bound order) and of the search; search/bounds.py
    builds it with the first bounds."""

    model: ModelSpec
    cluster: Cluster
    setup: TrainingSetup
    ctx: Table
    coef: np.ndarray
    dp_overlap: bool
    mixed_layers: bool
    """whether the model's layers differ (dense and MoE layers: different parameters)"""
    one_kind: bool
    """whether every layer of the chain is the same layer"""
    c: np.ndarray
    lay: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    m: np.ndarray
    zero: np.ndarray
    """the ZeRO stage each candidate is priced at (RuntimeRules.priced_zero of its own)"""
    shards: np.ndarray
    eshards: np.ndarray
    sigma: np.ndarray
    rec: np.ndarray
    """the recompute floor inside sigma"""
    least_state: np.ndarray
    """the least state bytes of a layer"""
    per_dense: np.ndarray
    per_expert: np.ndarray
    """state bytes per dense and per expert parameter (the candidate's ZeRO stage and shards)"""
    bottleneck: np.ndarray
    p2p: np.ndarray
    """the p2p time each candidate's stages show per micro-batch (cost/step.exposed_p2p_s)"""
    full: np.ndarray
    fixed: np.ndarray

    @property
    def capacity(self) -> float:
        """bytes a candidate may use on each GPU (cost/memory.capacity_bytes)"""
        return memory.capacity_bytes(self.cluster, self.setup)

    def pipe_floor_s(self, idx: np.ndarray, limit=np.inf) -> np.ndarray:
        """The pipeline part of the bound, tightened. Where the split is free, some stage holds
        at least n = ceil(L/p) layers, so the bottleneck is at least the least time of such a
        range at the first, the last or a middle stage (without the terms that need ZeRO or
        recompute counts; a stage's time only grows with its layers), and at least the first
        stage's time with layer 0 and the last's with layer L-1; and at least the least
        bottleneck under memory (_least_bottleneck, and _greedy_bottleneck where layers differ),
        with the least recomputation (_least_recompute) added to the sum. Where the split is fixed
        and the mode is 'full', each stage's least recomputation that fits (_fixed_recompute)
        adds to its time and, beyond the model-wide recompute floor, to the sum. The memory
        relaxations (the costly part) are skipped where the rest already reaches `limit` (per
        candidate: what the caller prunes at)."""
        L = self.model.layers
        pp, free = self.pp[idx], ~self.fixed[idx]
        bottleneck, sigma = self.bottleneck[idx].copy(), self.sigma[idx].copy()
        for sel, rec in self._fixed_recompute(idx):
            j, p, v = idx[sel], int(self.pp[idx[sel[0]]]), int(self.vpp[idx[sel[0]]])
            times = self.ctx.even_stage_s(self.c[j], p, v, L) + rec + self.p2p[j][:, None]
            bottleneck[sel] = np.maximum(bottleneck[sel], times.max(axis=1))
            sigma[sel] += np.maximum(0.0, rec.sum(axis=1) - self.rec[j])
        for p in sorted(set(pp[free].tolist())):
            sel = np.nonzero(free & (pp == p))[0]
            j = idx[sel]
            n = -(-L // p)
            used, back = np.unique(self.c[j], return_inverse=True)
            per = self.ctx.prefix("per")[used]
            least = np.minimum(per[:, n] + self.ctx.col("first_s")[used],
                               per[:, L] - per[:, L - n] + self.ctx.col("last_s")[used])
            if p >= 3:
                least = np.minimum(least, np.min(per[:, n + 1:L] - per[:, 1:L - n], axis=1))
            # and the first stage holds layer 0 and the embedding, the last layer L-1 and the head
            ends = np.maximum(per[:, 1] + self.ctx.col("first_s")[used],
                              per[:, L] - per[:, L - 1] + self.ctx.col("last_s")[used])
            bottleneck[sel] = np.maximum(bottleneck[sel], np.maximum(least, ends)[back] + self.p2p[j])
        free &= pipeline_floor_s(bottleneck, sigma, self.m[idx], self.vpp[idx]) < limit
        for p in sorted(set(pp[free].tolist()) - {1}):
            sel = np.nonzero(free & (pp == p))[0]
            least = np.max([self._least_bottleneck(idx[sel], p, cls) for cls in self._classes(idx[sel])], axis=0)
            if self.mixed_layers:
                least = np.maximum(least, self._greedy_bottleneck(idx[sel], p))
            bottleneck[sel] = np.maximum(bottleneck[sel], least + self.p2p[idx[sel]])
        for p in sorted(set(pp[free & self.full[idx]].tolist()) - {1}):
            sel = np.nonzero(free & self.full[idx] & (pp == p))[0]
            j = idx[sel]
            least = np.max([self._least_recompute(j, p, cls) * cls.rec[:, 0] for cls in self._classes(j)], axis=0)
            extra = np.maximum(0.0, least * (1 - SAFETY) - self.rec[j])
            sigma[sel] += extra
            bottleneck[sel] = np.maximum(bottleneck[sel], sigma[sel] / p)
        return pipeline_floor_s(bottleneck, sigma, self.m[idx], self.vpp[idx])

    def _greedy_bottleneck(self, j: np.ndarray, p: int) -> np.ndarray:
        """Least largest stage time over contiguous splits whose stages may also be empty, with
        each layer's own time (no ZeRO or recompute terms) and the ends' time on the first and
        last stage: a bisection on T where each stage, in order, reaches as far as T allows
        (reaching furthest is optimal: what a stage can hold, any part of it can too). Where
        layers differ (dense and MoE layers) this is tighter than counting layers at the least
        layer time."""
        L, k = self.model.layers, len(j)
        width = space.stage_width(L, p)
        c = self.c[j]
        row = np.arange(k)
        per = self.ctx.prefix("per")[c]
        first, last = self.ctx.col("first_s")[c], self.ctx.col("last_s")[c]
        big = float((per[:, L] + first + last).max()) * 4 + 1.0  # rows never reach into the next
        flat = (per + row[:, None] * big).ravel()

        def feasible(T):
            a = np.zeros(k, dtype=int)
            for stage in range(p):
                budget = T - (first if stage == 0 else 0.0) - (last if stage == p - 1 else 0.0)
                timed = np.searchsorted(flat, per[row, a] + budget + row * big, side="right") - 1 - row * (L + 1)
                a = np.maximum(a, np.minimum(np.minimum(timed, a + width), L))
            return a >= L

        lo, hi = np.zeros(k), per[:, L] + first + last
        ok = feasible(hi)
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            fits = feasible(mid)
            hi, lo = np.where(fits, mid, hi), np.where(fits, lo, mid)
        return np.where(ok, lo * (1 - SAFETY), np.inf)

    def _classes(self, j: np.ndarray):
        """The layer sets the memory relaxations run on (Layers): all layers at the model's
        per-layer minima, and, where layers differ, only the most numerous kind at its own
        values (leaving layers out only loosens a lower bound)."""
        c = self.c[j]
        col = (slice(None), None)
        yield Layers(self.model.layers, self.least_state[j][col], self.ctx.col("saved_b")[c][col],
                      self.ctx.col("saving")[c][col], self.ctx.col("layer_s")[c][col],
                      self.ctx.col("rec_cost_s")[c][col])
        if self.mixed_layers:
            count, params, expert, saved, saving, tau, rec = self.ctx.col("major")[c].T
            state = layer_state_bytes(self.per_dense[j], self.per_expert[j], params, expert)
            yield Layers(int(count[0]), state[col], saved[col], saving[col], tau[col], rec[col])

    def _least_bottleneck(self, j: np.ndarray, p: int, cls: Layers) -> np.ndarray:
        """Least largest stage time of any split that fits, over fractional splits: with a
        layer's least time tau, a stage given time x holds x / tau layers while
        u_i = C / (state + k_i saved) of them fit as they are; beyond u_i (recompute 'full'
        only) each extra layer needs rho_i = (state + k_i saved) / (k_i saving) recomputed
        layers of at least `rec` seconds, so it holds (x + rho_i rec u_i) / (tau + rho_i rec)
        layers, and never more than C / (state + k_i (saved - saving)) nor the stage width; the
        first and last stages also run the embedding and the head; a stage holds whole layers.
        The least T at which the stages hold all L layers is then the L-th least of the times
        T_i(c) at which stage i holds its c-th layer (per-layer minima of the layers in `cls`,
        the ends' memory left out: a lower bound)."""
        L, tau, rec = cls.layers, cls.tau, cls.rec
        c = self.c[j]
        full = self.full[j][:, None]
        free_layers, most, rho = self._stage_room(j, p, cls)
        most, rho = np.where(full, np.minimum(most, L), free_layers), np.where(full, rho, np.inf)
        width = space.stage_width(self.model.layers, p)
        most = np.minimum(most, width)

        # the first stage also runs the embedding and the last the LM head
        ends = np.zeros((len(j), p))
        ends[:, 0] += self.ctx.col("first_s")[c]
        ends[:, -1] += self.ctx.col("last_s")[c]

        # T_i(c), shaped (candidates, p, width); a hair of slack on c for rounding
        layers = np.arange(1, width + 1)[None, None, :] - 1e-9
        tau3, rec3, free3, rho3 = (np.broadcast_to(x, (len(j), p))[..., None] for x in (tau, rec, free_layers, rho))
        with np.errstate(invalid="ignore"):
            beyond = np.where(np.isfinite(rho3), layers * (tau3 + rho3 * rec3) - rho3 * rec3 * free3, np.inf)
        times = ends[..., None] + np.where(layers <= free3, layers * tau3, beyond)
        times = np.where(layers <= most[..., None], times, np.inf).reshape(len(j), -1)
        if times.shape[1] < L:
            return np.full(len(j), np.inf)
        least = np.partition(times, L - 1, axis=1)[:, L - 1]
        return least * (1 - SAFETY)

    def _stage_room(self, j: np.ndarray, p: int, cls: Layers) -> tuple:
        """Per candidate and stage i, shaped (candidates, p), for the layers of `cls` at their
        per-layer minima: u_i = C / c_i layers fit as they are (c_i = state + k_i saved, k_i in
        flight, C = capacity - reserve); each layer beyond needs rho_i = c_i / (k_i saving)
        recomputed layers, up to C / (c_i - k_i saving) layers in all (infinite when recomputing
        frees a layer's whole cost). Returns (u, that most, rho)."""
        C = self.capacity - memory.RUNTIME_RESERVED_BYTES
        k = in_flight(np.arange(p)[None, :], p, self.m[j][:, None], self.vpp[j][:, None])
        cost = cls.state + k * cls.saved
        with np.errstate(divide="ignore", invalid="ignore"):
            most = np.where(cost > k * cls.saving, C / (cost - k * cls.saving), np.inf)
            return C / cost, most, cost / (k * cls.saving)

    def _least_recompute(self, j: np.ndarray, p: int, cls: Layers) -> np.ndarray:
        """Least count of recomputed layers any split needs to fit, as a linear programme
        (layers and counts fractional, per-layer minima of the model): stage i holds
        u_i = C / c_i layers without recomputing, c_i = state + k_i saved (k_i in flight,
        C = capacity - reserve); each layer beyond costs rho_i = c_i / (k_i saving)
        recomputed layers, up to C / (c_i - k_i saving) layers in all. The layers beyond
        sum u_i go, cheapest rho first, to the stages with the most in flight (rho falls with
        k_i, which falls with i); infinite when they do not fit anywhere. Over the layers of
        `cls` at their per-layer minima."""
        L = cls.layers
        free_layers, most, rho = self._stage_room(j, p, cls)
        room = np.clip(most - free_layers, 0.0, L)  # no stage takes more than all the layers
        excess = L - free_layers.sum(axis=1)
        before = np.cumsum(room, axis=1) - room  # room of the stages filled earlier
        placed = np.clip(excess[:, None] - before, 0.0, room)
        with np.errstate(invalid="ignore"):  # 0 * inf where a stage takes nothing
            needed = np.where(placed > 0, placed * rho, 0.0).sum(axis=1)
        return np.where(excess <= 0, 0.0, np.where(room.sum(axis=1) >= excess, needed, np.inf))

    def floor_s(self, idx: np.ndarray) -> np.ndarray:
        """Per candidate, the least largest tail any split and recompute count can have: the
        first stage holds [0, n) and the last [L-n, L) for some n the space allows (with a fixed
        split, their known layers), so the largest tail is at least the least tail either can
        have, each computed with all its layers recomputed under 'full' (the most backward to
        hide the reduction behind; the optimizer step does not depend on it)."""
        out = np.zeros(len(idx))
        pp, vpp, fixed = self.pp[idx], self.vpp[idx], self.fixed[idx]
        L = self.model.layers
        for p, v, fx in sorted(set(zip(pp.tolist(), vpp.tolist(), fixed.tolist()))):
            sel = np.nonzero((pp == p) & (vpp == v) & (fixed == fx))[0]
            if fx:
                chunks, _ = even_chunks(L, p, v)
                first = [(a[:1], b[:1]) for a, b in chunks]
                last = [(a[-1:], b[-1:]) for a, b in chunks]
            else:
                n = np.arange(1, min(space.stage_width(L, p), L - p + 1) + 1)
                first, last = [(0 * n, n)], [(L - n, L + 0 * n)]
            parts = [(0, first), (p - 1, last)]
            largest = self._largest_stage_parts(p) if not fx and p > 1 else []
            tails = self._least_tails(idx[sel], p, parts + largest)
            out[sel] = np.maximum(tails[0], tails[1])
            if largest:
                out[sel] = np.maximum(out[sel], np.min(tails[2:], axis=0))
        return out

    def _largest_stage_parts(self, p: int) -> list:
        """Some stage holds at least n = ceil(L/p) layers, so the largest tail is at least the
        least tail of a range of n..width layers: at the first stage ([0, ...)), the last
        ([..., L)) or a middle one; a middle stage's tail only falls with its index (more
        micro-batches to hide behind), so stage p-2 stands for them all. The (stage, chunks)
        parts for _least_tails, whose least is that floor."""
        L = self.model.layers
        n = -(-L // p)
        lengths = np.arange(n, min(space.stage_width(L, p), L - p + 1) + 1)
        parts = [(0, [(0 * lengths, lengths)]), (p - 1, [(L - lengths, L + 0 * lengths)])]
        if p >= 3:
            # with one layer kind every start gives the same sums: one start stands for all
            starts = np.arange(1, 2 if self.one_kind else L)
            a, size = np.meshgrid(starts, lengths, indexing="ij")
            keep = a + size <= L - 1
            parts.append((p - 2, [(a[keep], (a + size)[keep])]))
        return parts

    def fits(self, idx: np.ndarray) -> np.ndarray:
        """Per candidate, False when its split is fixed (the even split) and some stage exceeds
        the GPU's memory even at its least: no recomputation, or (recompute 'full') all its
        layers recomputed, whichever holds less."""
        out = np.ones(len(idx), dtype=bool)
        for p, v, sel in self._fixed_groups(idx):
            out[sel] = self._even_fits(idx[sel], p, v)
        pp, free = self.pp[idx], ~self.fixed[idx]
        for p in sorted(set(pp[free].tolist()) - {1}):
            sel = np.nonzero(free & (pp == p))[0]
            # the even split is one of the free splits: where it fits, some split does
            sel = sel[~self._even_fits(idx[sel], p, 1)]
            for part in range(0, len(sel), SLICE):  # arrays of (candidates, layers, width)
                out[sel[part:part + SLICE]] = self._split_exists(idx[sel[part:part + SLICE]], p)
        return out

    def _even_fits(self, j: np.ndarray, p: int, v: int) -> np.ndarray:
        """Per candidate, whether every stage of the even split fits at its least (as in fits)."""
        memory, _ = self._even_memory(j, p, v)
        kept = memory("saved_b", False)
        least = self._least_memory(j, kept, memory("saved_f", True)) if self.full[j].any() else kept
        return np.all(least * (1 - SAFETY) <= self.capacity, axis=1)

    def _least_memory(self, j: np.ndarray, kept: np.ndarray, rebuilt: np.ndarray) -> np.ndarray:
        """A stage's least memory, `kept` (no layer recomputed) shaped (candidates, ...): under
        'full', the lesser of that and `rebuilt` (every layer recomputed, with the rebuild
        buffer)."""
        full = self.full[j].reshape(-1, *(1,) * (kept.ndim - 1))
        return np.where(full, np.minimum(kept, rebuilt), kept)

    def _split_exists(self, j: np.ndarray, p: int) -> np.ndarray:
        """Per candidate, whether some contiguous split into p stages of at most stage_width
        layers fits in memory, each stage at its least (as in fits): which layer boundaries the
        first i stages can reach, stage by stage (a boolean dynamic programme over every range
        of every candidate at once). The first stage starts at layer 0 and the last ends at L;
        a middle stage's memory is affine in its in-flight micro-batches, so it is evaluated at
        0 and 1 and scaled per stage."""
        L, cap = self.model.layers, self.capacity
        width = space.stage_width(L, p)
        n = np.arange(1, width + 1)
        m = self.m[j][:, None]

        def least(chunks, first, last, inflight):
            total, end = self._sums(j, chunks)
            kept = self._memory(j, total, end, first, last, inflight, "saved_b", False)
            if not self.full[j].any():
                return kept
            rebuilt = self._memory(j, total, end, first, last, inflight, "saved_f", True)
            return self._least_memory(j, kept, rebuilt)

        def fits(memory):
            return memory * (1 - SAFETY) <= cap

        reach = np.zeros((len(j), L + 1), dtype=bool)
        reach[:, 0] = True
        head = fits(least([(0 * n[None, :], n[None, :])], True, False, in_flight(0, p, m, 1)))
        reach[:, n] = head & (n <= L - (p - 1))
        if p > 2:
            a = np.arange(L)[None, :, None]
            valid = (a + n[None, None, :] <= L)
            ranges = np.minimum(a + n[None, None, :], L)

            def middle(saved_key, rebuilt, k):
                """A middle stage's memory over every range [a, a+n): affine in the layers' sums,
                so the empty range plus prefix sums of each layer's increment."""
                layer = np.arange(L)[None, :]
                one = self._memory(j, *self._sums(j, [(layer, layer + 1)]), False, False, k, saved_key, rebuilt)
                empty = self._memory(j, *self._sums(j, [(layer[:, :1], layer[:, :1])]), False, False, k,
                                     saved_key, rebuilt)
                steps = np.zeros((len(j), L + 1))
                np.cumsum(one - empty, axis=1, out=steps[:, 1:])
                rows = np.arange(len(j))[:, None, None]
                return empty[:, :, None] + steps[rows, ranges] - steps[rows, a]

            kept = [middle("saved_b", False, k) for k in (0.0, 1.0)]
            rebuilt = [middle("saved_f", True, k) for k in (0.0, 1.0)]
            for stage in range(1, p - 1):
                k = in_flight(stage, p, self.m[j], 1)[:, None, None]
                memory = self._least_memory(j, kept[0] + k * (kept[1] - kept[0]),
                                            rebuilt[0] + k * (rebuilt[1] - rebuilt[0]))
                ok = valid & fits(memory)
                nxt = np.zeros_like(reach)
                for size in range(1, width + 1):
                    nxt[:, size:] |= reach[:, :L + 1 - size] & ok[:, :L + 1 - size, size - 1]
                reach = nxt
        tail = fits(least([(L - n[None, :], L + 0 * n[None, :])], False, True, in_flight(p - 1, p, m, 1)))
        return np.any(reach[:, L - n] & tail & (n <= L - 1), axis=1)

    def _memory(self, j: np.ndarray, total, end, first, last, inflight, saved_key: str, rebuilt: bool,
                less_saved=0.0) -> np.ndarray:
        """Peak memory of candidates j's stage over the ranges `total` sums (cost/step's
        stage_memory): the first and/or the last stage, `inflight` micro-batches in flight,
        activations from prefix `saved_key` less `less_saved` per micro-batch, and the rebuild
        buffer of a recomputed layer when `rebuilt`."""
        extra = (1,) * (total("params").ndim - 1)
        dense, saved, head = stage_ends(first, last, total("params"), total(saved_key) - less_saved, end,
                                        self.m[j].reshape(-1, *extra), self.vpp[j].reshape(-1, *extra))
        transient = self.ctx.col("transient_bytes")[self.c[j]].reshape(-1, *extra) * rebuilt
        prefetch = self.ctx.col("prefetch_bytes")[self.c[j]].reshape(-1, *extra)
        expert = total("expert")
        return sum(stage_memory(self.zero[j].reshape(-1, *extra), dense, expert, self.shards[j].reshape(-1, *extra),
                                self.eshards[j].reshape(-1, *extra), inflight, saved, head, transient, prefetch,
                                self.setup))

    def _fixed_groups(self, idx: np.ndarray):
        """(pp, vpp, positions in idx) of the fixed-split candidates, grouped."""
        pp, vpp, fixed = self.pp[idx], self.vpp[idx], self.fixed[idx]
        for p, v in sorted(set(zip(pp[fixed].tolist(), vpp[fixed].tolist()))):
            yield p, v, np.nonzero(fixed & (pp == p) & (vpp == v))[0]

    def _even_memory(self, j: np.ndarray, p: int, v: int):
        """memory(saved_key, rebuilt, less_saved=0.0): _memory of candidates j's stages under the
        even split into p x v chunks, shaped (candidates, p); and each stage's layer count."""
        chunks, sizes = even_chunks(self.model.layers, p, v)
        total, end = self._sums(j, [(a[None, :], b[None, :]) for a, b in chunks])
        stage = np.arange(p)[None, :]
        args = (j, total, end, stage == 0, stage == p - 1, in_flight(stage, p, self.m[j][:, None], v))

        def memory(saved_key: str, rebuilt: bool, less_saved=0.0) -> np.ndarray:
            return self._memory(*args, saved_key, rebuilt, less_saved)

        return memory, np.broadcast_to(sizes, (len(j), p))

    def _fixed_memory(self, j: np.ndarray, p: int, v: int):
        """Per candidate and stage of the even split: peak memory with no layer recomputed,
        with the rebuild buffer but nothing recomputed yet, how much each recomputed layer saves
        at most (the model's largest per-layer saving: memory is at least affine in the count
        then), and the stage's layer count."""
        memory, sizes = self._even_memory(j, p, v)
        buffered = memory("saved_b", True)
        saving = self.ctx.col("saving")[self.c[j]][:, None]
        return memory("saved_b", False), buffered, buffered - memory("saved_b", True, saving), sizes

    def _fixed_recompute(self, idx: np.ndarray):
        """Per 'full' candidate with a fixed split, the least recomputation time of each stage
        that lets it fit: no layer when it fits as is, else at least
        r = ceil((memory with the rebuild buffer - capacity) / the most a layer saves) layers
        (and at least one), each costing at least the cheapest layer's recomputation. Yields
        (positions in idx, per-stage times)."""
        cap = self.capacity
        for p, v, sel in self._fixed_groups(idx):
            sel = sel[self.full[idx[sel]]]
            if not len(sel):
                continue
            j = idx[sel]
            kept, buffered, step, sizes = self._fixed_memory(j, p, v)
            with np.errstate(divide="ignore", invalid="ignore"):
                need = np.where(step > 0, np.ceil((buffered * (1 - SAFETY) - cap) / step - SAFETY), 1.0)
            layers = np.where(kept * (1 - SAFETY) <= cap, 0.0, np.clip(need, 1, sizes))
            cost = self.ctx.col("rec_cost_s")[self.c[j]][:, None]
            yield sel, layers * cost * (1 - SAFETY)

    def _sums(self, j: np.ndarray, chunks: list):
        """total(key): the prefix sums of candidates j's contexts summed over `chunks`
        [(a, b), ...] (arrays broadcasting to (candidates, options...)); end(key): an end term,
        shaped to broadcast likewise. Each key's sums are computed once (memory prices the same
        ranges several times); callers do not write into them."""
        rows = self.c[j].reshape(-1, *(1,) * (max(np.ndim(b) for _, b in chunks) - 1))
        sums: dict = {}

        def total(key):
            if key not in sums:
                prefix = self.ctx.prefix(key)
                sums[key] = sum(prefix[rows, b] - prefix[rows, a] for a, b in chunks)
            return sums[key]

        def end(key):
            return self.ctx.col(key)[rows]

        return total, end

    def _least_tails(self, j: np.ndarray, pp: int, parts: list) -> list[np.ndarray]:
        """Per part (stage, chunks), the least tail over the options (last axis of the chunks'
        arrays) of that stage holding those chunks; the parts, with as many chunks each, are
        priced in one pass."""
        sizes = [len(chunks[0][0]) for _, chunks in parts]
        chunks = [(np.concatenate([c[k][0] for _, c in parts])[None, :], np.concatenate([c[k][1] for _, c in parts])[None, :])
                  for k in range(len(parts[0][1]))]
        stage = np.concatenate([np.full(n, i) for (i, _), n in zip(parts, sizes)])[None, :]
        total, end = self._sums(j, chunks)
        dense = stage_ends(stage == 0, stage == pp - 1, total("params"), 0.0, end)[0]
        rec = np.where(self.full[j][:, None], total("rec_f"), total("rec_b"))
        col = (slice(None), None)
        exposed, opt = stage_tail_s(affine(self.coef, self.lay[j]), self.zero[j][col],
                                    dp_grad_bytes(self.setup.precision, self.setup.grad_reduce),
                                    gathered_bytes(gather_bytes(self.setup), dense, total("params"), total("expert")),
                                    dense, total("expert"), total("fwd"),
                                    total("bwd") + rec, stage, self.dp_overlap, self.shards[j][col],
                                    self.eshards[j][col], self.cluster, optimizer=optimizer_state_bytes(self.setup))
        tails = np.broadcast_to(exposed + opt, (len(j), sum(sizes)))
        return [part.min(axis=1) for part in np.split(tails, np.cumsum(sizes)[:-1], axis=1)]


class Layers(NamedTuple):
    """A set of layers for the memory relaxations: how many, and per layer (columns over
    candidates) the least state bytes, saved bytes, largest saving by full recomputation, stage
    time and full recompute time."""

    layers: int
    state: np.ndarray
    saved: np.ndarray
    saving: np.ndarray
    tau: np.ndarray
    rec: np.ndarray
