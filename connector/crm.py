"""Build an org's CRM adapter from its config (the connector's only way to reach a CRM)."""

from __future__ import annotations

from connector.config import HubSpotCrm, OrgConfig
from crm_adapters.base import CrmAdapter
from crm_adapters.hubspot import HubSpotAdapter, HubSpotSettings
from crm_adapters.salesforce import SalesforceAdapter, SalesforceSettings


def adapter_for(cfg: OrgConfig) -> CrmAdapter:
    crm = cfg.crm
    if isinstance(crm, HubSpotCrm):
        return HubSpotAdapter(
            HubSpotSettings(
                access_token=crm.auth.access_token.get_secret_value(),
                base_url=crm.base_url.rstrip("/"),
                object=crm.object,
                limit_per_10s=crm.limit_per_10s,
                extra_properties=tuple(dict.fromkeys([*crm.fetch_properties, *cfg.poll.fields])),
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
            extra_fields=tuple(cfg.poll.fields),
        )
    )
