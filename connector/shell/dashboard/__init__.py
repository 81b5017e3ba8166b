"""The operator's dashboard, served on the admin listener (never the public webhook port)."""

from connector.shell.dashboard.web import dashboard_routes

__all__ = ["dashboard_routes"]
