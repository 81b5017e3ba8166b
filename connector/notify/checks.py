"""`connector check-config --online` for notifications: the Slack token's scopes (auth.test)
and the SMTP relay's STARTTLS and login."""

from __future__ import annotations

from connector.core.config import OrgConfig
from connector.notify.outcomes import SendError


def online_check(cfg: OrgConfig) -> tuple[list[str], list[str]]:
    """(what was verified, problems), one line each, with no secret in them."""
    n = cfg.notifications
    ok: list[str] = []
    problems: list[str] = []
    if n is None:
        return ok, problems
    if n.slack is not None:
        from connector.notify.slack import NEEDED_SCOPES, SlackSender

        try:
            scopes = SlackSender(n.slack).scopes()
        except SendError as exc:
            problems.append(f"Slack: auth.test failed: {exc}")
        else:
            missing = [s for s in NEEDED_SCOPES if s not in scopes]
            if missing:
                problems.append(f"Slack: the bot token lacks the scopes {', '.join(missing)}")
            else:
                ok.append(f"Slack: the bot token has {', '.join(NEEDED_SCOPES)}")
    if n.email is not None:
        from connector.notify.email import EmailSender

        try:
            EmailSender(n.email).check_login()
        except SendError as exc:
            problems.append(f"email: {n.email.host}:{n.email.port}: {exc}")
        else:
            how = "STARTTLS" if n.email.starttls else "no TLS"
            login = " and login" if n.email.username else ""
            ok.append(f"email: {n.email.host}:{n.email.port} accepted {how}{login}")
    return ok, problems
