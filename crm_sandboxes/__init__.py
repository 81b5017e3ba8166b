"""Local simulators of the Salesforce and HubSpot APIs (and of the Slack Web API the
notifications use), for demos, tests and benchmarks."""

from __future__ import annotations

from crm_sandboxes._server import Reply, Request, SandboxServer
from crm_sandboxes.hubspot import HubSpotSandbox
from crm_sandboxes.salesforce import SalesforceSandbox
from crm_sandboxes.slack import SlackSandbox

__all__ = [
    "HubSpotSandbox",
    "Reply",
    "Request",
    "SalesforceSandbox",
    "SandboxServer",
    "SlackSandbox",
    "make_sandbox",
    "serve",
]


def make_sandbox(kind: str, hubspot_limit_per_10s: int = 100) -> SandboxServer:
    """A fresh, unstarted simulator of `kind` ("salesforce", "hubspot" or "slack")."""
    if kind == "salesforce":
        return SalesforceSandbox()
    if kind == "hubspot":
        return HubSpotSandbox(limit_per_10s=hubspot_limit_per_10s)
    if kind == "slack":
        return SlackSandbox()
    raise ValueError(f"unknown sandbox kind {kind!r}")


def serve(
    kind: str, host: str = "127.0.0.1", port: int = 0, hubspot_limit_per_10s: int = 100
) -> None:
    """Run a simulator in the foreground until interrupted (`connector sandbox KIND --port N`)."""
    make_sandbox(kind, hubspot_limit_per_10s).serve_forever(host, port)
