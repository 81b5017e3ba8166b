"""Notifications: rep messages on assignment and admin alerts, through Slack and email."""
