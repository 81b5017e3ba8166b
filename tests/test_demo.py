"""The README's main job, run the way a user runs it (a subprocess), on a smaller burst."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_end_to_end_and_every_guarantee_holds() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "connector", "demo", "--sf-leads", "200", "--hs-leads", "120"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "FAILED" not in out
    assert out.count("[ok]") == 11
    assert "[ok] every demo-sf rep told of each of their leads on Slack" in out
    told = re.search(
        r"Slack: (\d+) direct messages to (\d+) reps told them of (\d+) assignments", out
    )
    assert told is not None and int(told.group(3)) == 200 and int(told.group(2)) >= 4
    assert "[ok] leads at an Account's domain went to its owner, outside the rotation" in out
    assert "account-matched leads  : 4 at Initech's domain, to its owner Edsger Dijkstra" in out
    assert "org demo-sf (salesforce): 200 of 200 leads assigned" in out
    assert "org demo-hs (hubspot): 120 of 120 leads assigned" in out
    # The 40 leads never pushed are found by the poll (it may also reach pushed ones first:
    # either path routes a record once).
    poll = re.search(r"'poll': (\d+)", out)
    assert poll is not None and int(poll.group(1)) >= 40
    assert "PATCH composite/sobjects" in out and "contacts/batch/update" in out
