"""What the tests and the benchmarks both stand on: a real PostgreSQL (``pg``), waiting with a
deadline (``waiting``), the multi-process harness and its one-statement ceiling (``harness``,
``ceiling.sql``) and org configs on the CRM sandboxes (``crm_orgs``).

It imports neither ``tests`` nor ``bench`` (pyproject's import-linter contracts), so neither of
those imports the other, and it is not in the product's wheel (pyproject's package list).
"""
