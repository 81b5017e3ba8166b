"""A local SMTP relay for the notification tests (aiosmtpd): STARTTLS required with a
self-signed certificate made by the openssl command, AUTH LOGIN/PLAIN checked against one
user, every accepted message kept."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.helpers.ports import free_port


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "smtp.crt", folder / "smtp.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@dataclass
class Relay:
    port: int
    ca_file: str
    user: str = "routing"
    password: str = "pw-123"
    messages: list[Message] = field(default_factory=list)
    envelopes: list[tuple[str, list[str], bool]] = field(default_factory=list)  # from, to, tls
    refuse: dict[str, int] = field(default_factory=dict)  # recipient -> SMTP code

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        code = self.refuse.get(address)
        if code is not None:
            return f"{code} refused"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        self.envelopes.append(
            (envelope.mail_from, list(envelope.rcpt_tos), session.ssl is not None)
        )
        return "250 Message accepted"

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        ok = (
            isinstance(data, LoginPassword)
            and data.login.decode() == self.user
            and data.password.decode() == self.password
        )
        return AuthResult(success=ok, handled=False)


@contextmanager
def smtp_relay(folder: Path) -> Iterator[Relay]:
    cert, key = self_signed(folder)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    relay = Relay(port=free_port(), ca_file=str(cert))
    controller = Controller(
        relay,
        hostname="127.0.0.1",
        port=relay.port,
        tls_context=ctx,
        require_starttls=True,
        auth_require_tls=True,
        authenticator=relay.authenticate,
    )
    controller.start()
    try:
        yield relay
    finally:
        controller.stop()
