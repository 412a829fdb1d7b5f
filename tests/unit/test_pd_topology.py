"""PD topology rules (Kthena's): group = the groupKey label, role = prefillLabels /
decodeLabels; endpoints that cannot take part are listed with the reason; a server
without a pair gets the problem text its requests are refused with."""

from __future__ import annotations

from pathlib import Path

from pd_fixtures import KEY, ep, pd_state


def test_groups_and_roles(tmp_path: Path) -> None:
    st = pd_state(tmp_path, [ep(9001, "a", "prefill"), ep(9002, "a", "decode"), ep(9003, "b", "prefill"),
                             ep(9004, "b", "decode"), ep(9005, "b", "decode")])
    topo = st.pd[KEY]
    assert topo.problem is None and topo.ignored == ()
    assert sorted(topo.groups) == ["a", "b"]
    assert [e.port for e in topo.groups["b"].prefill] == [9003]
    assert [e.port for e in topo.groups["b"].decode] == [9004, 9005]
    assert [e.port for e in topo.decode] == [9002, 9004, 9005]
    assert topo.group_of["127.0.0.1:9003"] == "b" and topo.connector == "http"


def test_endpoints_that_cannot_take_part_are_listed_with_the_reason(tmp_path: Path) -> None:
    st = pd_state(tmp_path, [ep(9001, "a", "prefill"), ep(9002, "a", "decode"),
                             ep(9003, None, "decode"),  # no group label
                             ep(9004, "a", None),  # neither role
                             ep(9005, "c", "prefill")])  # a group without decode
    topo = st.pd[KEY]
    assert topo.problem is None and list(topo.groups) == ["a"]
    assert topo.ignored == (
        "127.0.0.1:9003: no 'group' label (pdGroup.groupKey)",
        "127.0.0.1:9004: matches neither prefillLabels nor decodeLabels",
        "127.0.0.1:9005: group 'c' has no decode endpoint",
    )
    assert "127.0.0.1:9005" not in topo.group_of


def test_an_endpoint_matching_both_roles_is_ignored(tmp_path: Path) -> None:
    pd = {"groupKey": "group", "prefillLabels": {"tier": "pd"}, "decodeLabels": {"role": "decode"}}
    st = pd_state(tmp_path, [ep(9001, "a", None, tier="pd"), ep(9002, "a", "decode"),
                             ep(9003, "a", "decode", tier="pd")], pd)
    topo = st.pd[KEY]
    assert topo.ignored == ("127.0.0.1:9003: matches both prefillLabels and decodeLabels",)
    assert [e.port for e in topo.groups["a"].decode] == [9002]


def test_problem_texts(tmp_path: Path) -> None:
    def problem(eps: list) -> str | None:
        return pd_state(tmp_path, eps).pd[KEY].problem

    assert problem([ep(9001, "a", "prefill")]) == "ModelServer default/s (pdGroup) has no decode endpoint"
    assert problem([ep(9002, "a", "decode")]) == "ModelServer default/s (pdGroup) has no prefill endpoint"
    assert problem([ep(9003, None, None)]) == "ModelServer default/s (pdGroup) has no prefill and no decode endpoint"
    assert problem([ep(9001, "a", "prefill"), ep(9002, "b", "decode")]) == (
        "ModelServer default/s (pdGroup): no group (label 'group') has both a prefill and a decode endpoint")
    assert pd_state(tmp_path, [ep(9001, "a", "prefill")]).pd[KEY].decode == ()
