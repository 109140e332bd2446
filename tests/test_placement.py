"""Golden rank groups (Megatron's RankGenerator convention: order innermost first)."""

import pytest

from planner.placement import group_of_rank0, has_expert_layout, span, tiers


def test_worked_example_of_the_docstring():
    degrees = {"tp": 2, "cp": 1, "dp": 2, "pp": 2, "ep": 1}
    assert group_of_rank0("tp-cp-ep-dp-pp", degrees, ("tp",)) == [0, 1]
    assert group_of_rank0("tp-cp-ep-dp-pp", degrees, ("dp",)) == [0, 2]
    assert group_of_rank0("tp-cp-ep-dp-pp", degrees, ("pp",)) == [0, 4]


def test_dp_innermost_order():
    degrees = {"tp": 2, "cp": 1, "dp": 4, "pp": 1, "ep": 1}
    assert group_of_rank0("dp-tp-cp-pp", degrees, ("dp",)) == [0, 1, 2, 3]
    assert group_of_rank0("dp-tp-cp-pp", degrees, ("tp",)) == [0, 4]


@pytest.mark.parametrize("order,expect", [
    ("tp-cp-ep-dp-pp", {"tp": "intra_node", "dp": "inter_node", "pp": "inter_node"}),
    ("tp-pp-dp-cp", {"tp": "intra_node", "pp": "intra_node", "dp": "inter_node"}),
])
def test_tiers_follow_the_order(order, expect):
    degrees = {"tp": 4, "cp": 1, "dp": 4, "pp": 2, "ep": 1}
    assert tiers(order, degrees, 8) == expect


def test_span_counts_ranks_per_node():
    degrees = {"tp": 2, "cp": 1, "dp": 8, "pp": 1, "ep": 1}
    s = span("tp-cp-ep-dp-pp", degrees, ("dp",), 8)
    assert (s.size, s.per_node, s.nodes) == (8, 4, 2)


def test_expert_group_is_innermost_of_dp():
    degrees = {"tp": 2, "cp": 1, "dp": 8, "pp": 1, "ep": 4}
    ep = span("tp-cp-ep-dp-pp", degrees, ("ep",), 8)
    edp = span("tp-cp-ep-dp-pp", degrees, ("edp",), 8)
    assert (ep.size, ep.nodes) == (4, 1)
    assert (edp.size, edp.nodes) == (2, 2)


def test_megatron_docstring_example():
    """megatron/core/parallel_state.py, initialize_model_parallel docstring: 16 GPUs, tp 2, pp 4
    (dp 2), default order tp-cp-ep-dp-pp."""
    from planner.placement import rank_groups

    degrees = {"tp": 2, "cp": 1, "dp": 2, "pp": 4, "ep": 1}
    order = "tp-cp-ep-dp-pp"
    assert rank_groups(order, degrees, "dp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert rank_groups(order, degrees, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert rank_groups(order, degrees, "pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]


def test_expert_groups_tile_the_data_parallel_ranks():
    from planner.placement import rank_groups

    degrees = {"tp": 2, "cp": 1, "dp": 4, "pp": 1, "ep": 2}
    assert rank_groups("tp-cp-ep-dp-pp", degrees, "ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-dp-cp-pp", "cp-tp-pp-dp"])
def test_group_spans_equal_each_groups_span(order):
    """group_spans (the search's fast path, one progression of ranks per group) gives each
    group's span as span() finds it from the group's own dimensions, over degrees that put groups
    within a node, across nodes, and straddling them."""
    from planner.placement import GROUPS, group_spans

    for tp, cp, dp, pp, ep in [(1, 1, 1, 1, 1), (2, 1, 4, 2, 1), (8, 1, 16, 4, 1), (4, 2, 6, 3, 2), (1, 4, 8, 2, 4),
                               (2, 2, 15, 5, 3), (8, 2, 4, 2, 8), (1, 1, 64, 1, 16)]:
        degrees = {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep}
        if not has_expert_layout(order, tp, cp, dp, pp, ep):
            continue  # ep 3 beside cp 2 where cp and dp do not chain: no such placement
        for g in (1, 4, 8):
            dims = {"dpcp": ("cp", "dp")}
            expected = tuple(span(order, degrees, dims.get(name, (name,)), g) for name in GROUPS)
            assert group_spans(order, tp, cp, dp, pp, ep, g) == expected, (degrees, g)


ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-dp-cp-pp", "cp-tp-pp-dp", "pp-dp-cp-tp", "dp-tp-cp-pp")


def _degree_tuples(total: int):
    divs = [d for d in range(1, total + 1) if total % d == 0]
    return [(tp, cp, total // (tp * cp * pp), pp) for tp in divs for cp in divs for pp in divs
            if total % (tp * cp * pp) == 0]


def _check_worst_group(order, tp, cp, dp, pp, ep, g, etp=0):
    from planner.placement import GROUPS, expert_degrees, group_spans, rank_groups, span_of, worst

    degrees = expert_degrees(tp, cp, dp, pp, ep, etp)
    for name, priced in zip(GROUPS, group_spans(order, tp, cp, dp, pp, ep, g, etp)):
        groups = rank_groups(order, degrees, name)
        assert sorted(r for grp in groups for r in grp) == list(range(tp * cp * dp * pp)), (order, degrees, name)
        assert priced == worst(span_of(grp, g) for grp in groups), (order, degrees, g, name)


@pytest.mark.parametrize("g", [4, 8, 72])
def test_folded_expert_groups_price_their_slowest_group(g):
    """MoE parallel folding (expert tp 1 under tp > 1): on every degree tuple up to 48 GPUs and
    every order that lays folded experts out, the ep and edp groups tile the ranks and the span
    priced is the slowest of them; an ep group is ep ranks etp apart inside one pipeline stage."""
    from planner.placement import rank_groups
    laid = 0
    for total in range(1, 49):
        if total > g and total % g:
            continue
        for tp, cp, dp, pp in _degree_tuples(total):
            if tp == 1:
                continue
            for order in ORDERS:
                for ep in (e for e in (2, 3, 4, 6, 8, 16) if (tp * cp * dp) % e == 0):
                    if not has_expert_layout(order, tp, cp, dp, pp, ep, 1):
                        continue
                    laid += 1
                    _check_worst_group(order, tp, cp, dp, pp, ep, g, 1)
                    first = rank_groups(order, {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": 1}, "ep")[0]
                    assert first == list(range(ep)), (order, tp, cp, dp, pp, ep)
    assert laid > 100


@pytest.mark.parametrize("g", [4, 8, 72])
def test_priced_span_is_the_slowest_group_exhaustive(g):
    """Every rank order and degree tuple on GPU counts up to 48 (partial nodes included): the
    span the cost model prices for each kind of group is the slowest of all its groups."""
    for total in range(1, 49):
        if total > g and total % g:
            continue
        for tp, cp, dp, pp in _degree_tuples(total):
            for order in ORDERS:
                for ep in (e for e in (1, 2, 3, 4, 6, 8) if (dp * cp) % e == 0
                           and has_expert_layout(order, tp, cp, dp, pp, e)):
                    _check_worst_group(order, tp, cp, dp, pp, ep, g)


@pytest.mark.parametrize("g", [4, 8, 72])
def test_priced_span_is_the_slowest_group_sampled(g):
    """The same on whole-node counts up to 1,152 GPUs, a seeded sample of degree tuples each."""
    import random

    rng = random.Random(g)
    for total in range(g, 1153, g):
        tuples = _degree_tuples(total)
        for tp, cp, dp, pp in rng.sample(tuples, min(6, len(tuples))):
            order = rng.choice(ORDERS)
            ep = rng.choice([e for e in (1, 2, 4, 8, 16) if (dp * cp) % e == 0
                             and has_expert_layout(order, tp, cp, dp, pp, e)])
            _check_worst_group(order, tp, cp, dp, pp, ep, g)


def test_a_degree_that_does_not_divide_the_node_straddles_it():
    """tp 6 on 8-GPU nodes: the group [6..11] has 2 ranks on node 0 and 4 on node 1, so tp is
    priced over the inter-node tier (the group holding rank 0 alone sits inside node 0)."""
    from planner.placement import rank_groups, span_of

    degrees = {"tp": 6, "cp": 2, "dp": 4, "pp": 8, "ep": 1}
    assert rank_groups("tp-cp-ep-dp-pp", degrees, "tp")[1] == list(range(6, 12))
    assert span_of(range(6, 12), 8) == span("tp-cp-ep-dp-pp", degrees, ("tp",), 8) == (6, 2, 2)
    assert tiers("tp-cp-ep-dp-pp", degrees, 8)["tp"] == "inter_node"
