"""What several test modules share: clocks, orgs, sandboxes, worlds, waits on the server, the
fault suite's machinery. A test module imports from here (or from testbed), never from another
test module (pyproject's import-linter contract keeps tests.test_* and tests.conftest apart).
"""
