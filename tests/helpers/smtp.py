"""A local SMTP relay for the notification tests (aiosmtpd): STARTTLS required with a
self-signed certificate (made with the cryptography package: no openssl command needed),
AUTH LOGIN/PLAIN checked against one user, every accepted message kept."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.helpers.ports import free_port


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A one-day certificate for 127.0.0.1 and its key, as PEM files in ``folder``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "smtp.crt", folder / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


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
