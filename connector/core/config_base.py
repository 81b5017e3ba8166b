"""What every configuration model shares: unknown keys are errors, values are frozen."""

from __future__ import annotations

from pydantic import ConfigDict, SecretStr

STRICT = ConfigDict(extra="forbid", frozen=True)


class SecretUrl(SecretStr):
    """A secret written as a URL: only its password must be a ``${ENV}`` reference."""
