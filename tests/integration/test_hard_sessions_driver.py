"""The closed-loop session driver (client.drive_sessions) against a real simulator:
a later turn goes out only after the previous reply has ended plus its think time."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from loadtest.shared_prefix.client import Chooser, drive_sessions
from loadtest.shared_prefix.hard_workloads import MultiTurnSpec
from tests.harness import start_simulator


def test_turns_wait_for_the_reply_and_the_think_time(tmp_path: Path) -> None:
    spec = replace(MultiTurnSpec(), num_sessions=3, min_turns=3, max_turns=3, system_len=32,
                   question_len=(20, 40), reply_len=(4, 8), seed=4)
    plan = spec.plan()
    think = 0.15  # wall seconds, fixed so the check below is exact
    thinks = [[0.0] + [think] * (len(s) - 1) for s in plan.sessions]
    starts = [0.0, 0.05, 0.1]
    sim = start_simulator(tmp_path, engines=1, fast=True, model="base")
    try:
        stats = asyncio.run(drive_sessions(plan.sessions, starts, thinks, sim.urls, Chooser(),
                                           "base", max_concurrency=8, timeout_s=30.0))
    finally:
        sim.process.kill_group()
    assert len(stats.results) == 9 and all(r.ok for r in stats.results), stats.results
    by_index = {r.index: r for r in stats.results}
    for session, start in zip(plan.sessions, starts):
        first = by_index[session[0].index]
        assert first.sent_at >= start
        for prev, cur in zip(session, session[1:]):
            p, c = by_index[prev.index], by_index[cur.index]
            assert c.sent_at >= p.sent_at + p.e2e_s + think
    # sessions overlap: the second session started before the first one ended
    s0_end = max(by_index[r.index].sent_at for r in plan.sessions[0])
    assert by_index[plan.sessions[1][0].index].sent_at < s0_end
