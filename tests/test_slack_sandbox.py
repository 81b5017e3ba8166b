"""The Slack simulator speaks Slack's shapes: errors as HTTP 200 {"ok": false}, 429
`ratelimited` with a whole-second Retry-After past a channel's pace, missing_scope with
needed/provided, and slack-sdk's WebClient reads it as it reads Slack."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from crm_sandboxes import make_sandbox
from crm_sandboxes.slack import SlackSandbox


@pytest.fixture
def slack() -> Iterator[SlackSandbox]:
    box = make_sandbox("slack")
    assert isinstance(box, SlackSandbox)
    box.configure(burst=2)
    box.start()
    box.add_user("ada@acme.test", "UADA")
    yield box
    box.stop()


def post(slack: SlackSandbox, method: str, token: str | None, **body: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{slack.url}/api/{method}", json=body, headers=headers)


def test_errors_are_http_200_with_ok_false(slack: SlackSandbox) -> None:
    r = post(slack, "chat.postMessage", None, channel="UADA", text="hi")
    assert (r.status_code, r.json()) == (200, {"ok": False, "error": "not_authed"})
    r = post(slack, "chat.postMessage", "xoxb-wrong", channel="UADA", text="hi")
    assert r.json() == {"ok": False, "error": "invalid_auth"}
    r = post(slack, "chat.postMessage", slack.token, channel="UNOBODY", text="hi")
    assert r.json() == {"ok": False, "error": "channel_not_found"}
    r = post(slack, "chat.postMessage", slack.token, channel="UADA")
    assert r.json() == {"ok": False, "error": "no_text"}
    assert slack.messages() == []


def test_a_channel_past_its_pace_gets_429_with_retry_after(slack: SlackSandbox) -> None:
    answers = [
        post(slack, "chat.postMessage", slack.token, channel="UADA", text="x") for _ in range(3)
    ]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json() == {"ok": False, "error": "ratelimited"}
    assert answers[2].headers["Retry-After"] == "1"
    assert len(slack.messages()) == 2


def test_slack_sdk_reads_scopes_lookups_and_missing_scope(slack: SlackSandbox) -> None:
    client = WebClient(token=slack.token, base_url=f"{slack.url}/api/")
    assert client.auth_test().headers["x-oauth-scopes"] == "chat:write,users:read,users:read.email"
    assert client.users_lookupByEmail(email="ADA@acme.test")["user"]["id"] == "UADA"
    slack.configure(scopes=["chat:write"])
    with pytest.raises(SlackApiError) as info:
        client.users_lookupByEmail(email="ada@acme.test")
    assert info.value.response.data == {
        "ok": False,
        "error": "missing_scope",
        "needed": "users:read.email",
        "provided": "chat:write",
    }
