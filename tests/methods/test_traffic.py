"""What travels after the weights is named once (``protocol.traffic``), read by name on both
sides: each method's client declares its ``receives`` / ``sends`` by its Strategy's
``TRAFFIC`` names, and the servers' packing and splitting go through the same names."""

from __future__ import annotations

import numpy as np
import pytest

from fl_app.registry import get_method, method_names
from protocol.traffic import WEIGHTS_ONLY, Traffic, append_groups, split_groups


@pytest.mark.parametrize("name", method_names())
def test_the_client_and_the_server_name_the_same_groups_in_the_same_order(name):
    method = get_method(name)
    traffic = getattr(method.strategy, "TRAFFIC", WEIGHTS_ONLY)
    assert isinstance(traffic, Traffic)
    assert (tuple(method.update.receives), tuple(method.update.sends)) == (traffic.down, traffic.up), name


def test_groups_are_appended_and_split_by_name():
    weights = [np.zeros(2), np.ones(3)]
    sent = append_groups(weights, {"b": [np.full(1, 7.0)], "a": [np.full(2, 5.0), np.full(1, 6.0)]}, ("a", "b"))
    assert [a.tolist() for a in sent] == [[0, 0], [1, 1, 1], [5, 5], [6], [7]]
    back, groups = split_groups(sent, 2, {"a": 2, "b": 1}, "a reply")
    assert [a.tolist() for a in back] == [[0, 0], [1, 1, 1]]
    assert [a.tolist() for a in groups["a"]] == [[5, 5], [6]] and [a.tolist() for a in groups["b"]] == [[7]]


def test_a_message_with_other_counts_is_refused_naming_the_groups():
    with pytest.raises(ValueError, match=r"a SCAFFOLD reply carries 1 arrays after the 2 weights, expected 2 \(delta_c\)"):
        split_groups([np.zeros(1)] * 3, 2, {"delta_c": 2}, "a SCAFFOLD reply")
    with pytest.raises(ValueError, match="do not match the declared"):
        append_groups([], {"c": []}, ("s",))
