"""Email through an SMTP relay with smtplib: STARTTLS (verified against the system's CAs or
`ca_file`) before any login, one text/plain message per notification, its Message-ID made
from the dedupe key (a repeat after a crash carries the same one)."""

from __future__ import annotations

import hashlib
import smtplib
import ssl
from email.message import EmailMessage

from connector.core.notify_config import EmailSettings, RepContact
from connector.notify.messages import Message
from connector.notify.outcomes import ChannelDown, SendError, Undeliverable


def message_id(dedupe_key: str) -> str:
    return f"<{hashlib.sha256(dedupe_key.encode()).hexdigest()[:40]}@lead-routing-connector>"


class EmailSender:
    def __init__(self, settings: EmailSettings) -> None:
        self.settings = settings

    def _tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.settings.ca_file)

    def _open(self) -> smtplib.SMTP:
        s = self.settings
        smtp = smtplib.SMTP(s.host, s.port, timeout=s.timeout_seconds)
        try:
            smtp.ehlo()
            if s.starttls:
                smtp.starttls(context=self._tls())
                smtp.ehlo()
            if s.username is not None and s.password is not None:
                smtp.login(s.username, s.password.get_secret_value())
        except BaseException:
            smtp.close()
            raise
        return smtp

    def recipients(self, msg: Message, contact: RepContact | None) -> list[str]:
        if msg.recipient == "admins":
            return list(self.settings.admin_to)
        if contact is None or not contact.email:
            raise Undeliverable(
                "no_address", f"rep {msg.recipient} has no email in notifications.reps"
            )
        return [contact.email]

    def send(self, msg: Message, contact: RepContact | None) -> None:
        to = self.recipients(msg, contact)
        if not to:
            raise Undeliverable("no_address", "notifications.email.admin_to is empty")
        em = EmailMessage()
        em["From"] = self.settings.sender
        em["To"] = ", ".join(to)
        em["Subject"] = msg.subject
        em["Message-ID"] = message_id(msg.dedupe_key)
        em.set_content(msg.text)
        try:
            with self._open() as smtp:
                smtp.send_message(em)
        except Exception as exc:
            raise classify(exc) from None

    def check_login(self) -> None:
        """Connect, STARTTLS and log in (`check-config --online`); raises SendError."""
        try:
            with self._open() as smtp:
                smtp.noop()
        except Exception as exc:
            raise classify(exc) from None


def classify(exc: BaseException) -> SendError:
    """An SMTP failure as the dispatcher's error: a permanent (5xx) refusal of the recipients
    or the message is this message's; anything else (4xx, login, TLS, the connection) is the
    channel's."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in exc.recipients.values()]
        if codes and all(c >= 500 for c in codes):
            return Undeliverable("recipient_refused", f"SMTP {codes[0]}")
        return ChannelDown("recipient_deferred", f"SMTP {codes[0] if codes else '?'}")
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return ChannelDown("smtp_auth", f"SMTP {exc.smtp_code}")
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return ChannelDown("starttls_unsupported", "the relay offers no STARTTLS")
    if isinstance(exc, smtplib.SMTPDataError):
        if exc.smtp_code >= 500:
            return Undeliverable("message_refused", f"SMTP {exc.smtp_code}")
        return ChannelDown("deferred", f"SMTP {exc.smtp_code}")
    if isinstance(exc, smtplib.SMTPResponseException):
        return ChannelDown("smtp", f"SMTP {exc.smtp_code}")
    if isinstance(exc, ssl.SSLError):
        return ChannelDown("tls", type(exc).__name__)
    return ChannelDown("transport", type(exc).__name__)
