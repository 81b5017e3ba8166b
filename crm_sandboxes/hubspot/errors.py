"""The HubSpot simulator's error answer: HubSpot's JSON error body with a correlation id."""

from __future__ import annotations

from typing import Any

from crm_sandboxes._server import Reply, correlation_id


def _error(status: int, message: str, category: str, **extra: Any) -> Reply:
    body = {
        "status": "error",
        "message": message,
        "correlationId": correlation_id(),
        "category": category,
        **extra,
    }
    return Reply(status, body)
