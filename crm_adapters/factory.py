"""Build a CrmAdapter from its kind and settings (a settings object or a plain mapping)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crm_adapters.base import CrmAdapter
from crm_adapters.hubspot import HubSpotAdapter, HubSpotSettings
from crm_adapters.salesforce import SalesforceAdapter, SalesforceSettings

__all__ = ["KINDS", "build_adapter"]

KINDS = ("salesforce", "hubspot")


def build_adapter(
    kind: str, settings: SalesforceSettings | HubSpotSettings | Mapping[str, Any]
) -> CrmAdapter:
    """`build_adapter("salesforce", SalesforceSettings(...))` or with a config mapping."""
    if kind == "salesforce":
        if isinstance(settings, HubSpotSettings):
            raise TypeError("salesforce adapter needs SalesforceSettings")
        sf = (
            settings
            if isinstance(settings, SalesforceSettings)
            else SalesforceSettings.from_mapping(settings)
        )
        return SalesforceAdapter(sf)
    if kind == "hubspot":
        if isinstance(settings, SalesforceSettings):
            raise TypeError("hubspot adapter needs HubSpotSettings")
        hs = (
            settings
            if isinstance(settings, HubSpotSettings)
            else HubSpotSettings.from_mapping(settings)
        )
        return HubSpotAdapter(hs)
    raise ValueError(f"unknown CRM kind {kind!r}; expected one of {KINDS}")
