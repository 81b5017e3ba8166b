"""CRM adapters: one Protocol (base.CrmAdapter), Salesforce and HubSpot implementations."""

from crm_adapters.base import (
    AuthError,
    CrmAdapter,
    CrmError,
    CrmRecord,
    OwnerWrite,
    PermanentError,
    RateLimitedError,
    RetryableError,
    WriteOutcome,
)
from crm_adapters.batching import backoff_delay, plan_batches

__all__ = [
    "AuthError",
    "CrmAdapter",
    "CrmError",
    "CrmRecord",
    "OwnerWrite",
    "PermanentError",
    "RateLimitedError",
    "RetryableError",
    "WriteOutcome",
    "backoff_delay",
    "plan_batches",
]
