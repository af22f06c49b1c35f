"""Who the summary names when a scheduler exits with code 4 for members declared dead (docs/deployment.md,
"Failures"): the member lost, not the scheduler."""

from __future__ import annotations


def test_a_member_a_scheduler_lost_is_the_culprit_not_the_scheduler():
    """A scheduler that exits with code 4 for members declared dead writes a ``lost`` finding, and the summary names
    the member (``runs.findings.culprit``) where it used to name ``global_scheduler`` and its exit code."""
    from geomx.runs.findings import LOST, culprit

    why = "no heartbeat for 11.0 s (limit 10 s), declared by global_scheduler"
    finding = {"time": 1.0, "by": "global_scheduler", "what": LOST, "clients": ["dc1/server"],
               "why": {"dc1/server": why}}
    assert culprit([finding], "global_scheduler", {"global_scheduler": 4, "dc1/server": -15}) == \
        ("dc1/server", f"dc1/server was lost: {why}")
