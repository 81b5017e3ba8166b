"""Build and share each org's CRM adapter (the connector's only way to reach a CRM)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from connector.core.config import HubSpotCrm, OrgConfig
from crm_adapters.base import CrmAdapter
from crm_adapters.hubspot import HubSpotAdapter, HubSpotSettings
from crm_adapters.salesforce import SalesforceAdapter, SalesforceSettings


def adapter_for(cfg: OrgConfig) -> CrmAdapter:
    """A new adapter for one org; every read returns the fields its rules need."""
    crm = cfg.crm
    if isinstance(crm, HubSpotCrm):
        return HubSpotAdapter(
            HubSpotSettings(
                access_token=crm.auth.access_token.get_secret_value(),
                base_url=crm.base_url.rstrip("/"),
                object=crm.object,
                limit_per_10s=crm.limit_per_10s,
                extra_properties=tuple(cfg.read_fields),
            )
        )
    auth = {
        k: (v.get_secret_value() if hasattr(v, "get_secret_value") else str(v))
        for k, v in crm.auth.model_dump().items()
        if v is not None
    }
    return SalesforceAdapter(
        SalesforceSettings(
            instance_url=crm.instance_url.rstrip("/"),
            auth=auth,
            object=crm.object,
            parent_field=crm.parent_field,
            api_version=crm.api_version,
            extra_fields=tuple(cfg.read_fields),
            account_domain_field=cfg.accounts.domain_field if cfg.accounts else None,
        )
    )


class Adapters:
    """One adapter per org, built on first use and shared by the threads of this process."""

    def __init__(self, configs: Mapping[str, OrgConfig]) -> None:
        self.configs = configs
        self._adapters: dict[str, CrmAdapter] = {}
        self._lock = threading.Lock()

    def get(self, org: str) -> CrmAdapter:
        with self._lock:
            if org not in self._adapters:
                self._adapters[org] = adapter_for(self.configs[org])
            return self._adapters[org]
