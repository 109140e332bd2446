"""Golden rank groups (Megatron's RankGenerator convention: order innermost first)."""

import pytest

from planner.placement import group_of_rank0, span, tiers


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
