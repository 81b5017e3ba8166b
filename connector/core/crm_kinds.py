"""What the connector knows about each kind of CRM, in one descriptor per kind.

Everything outside ``crm_adapters`` that depends on which CRM an org uses asks ``crm_kind``
(by the config's ``crm.kind``) instead of comparing the kind's name: how ids compare, what an
import file's id column is called, where the owner sits, how the pipeline paces its calls, the
inbox's source name, and how to build the adapter. A third CRM is its adapter, its sandbox and
one descriptor here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from connector.core.config import HubSpotCrm, OrgConfig, SalesforceCrm
from connector.core.pacing import NOMINAL_CALLS_PER_S, Pacing, pacing_for
from crm_adapters.batching import HUBSPOT_BATCH_MAX
from crm_adapters.fields import HUBSPOT_OWNER_PROPERTY, SALESFORCE_OWNER_FIELD
from crm_adapters.salesforce_ids import id_key as salesforce_id_key
from crm_adapters.salesforce_ids import is_id as salesforce_is_id

if TYPE_CHECKING:
    from crm_adapters.base import CrmAdapter

__all__ = ["CRM_KINDS", "HUBSPOT", "SALESFORCE", "CrmKind", "crm_kind", "org_pacing"]


def _same(value: str) -> str:
    return value


def _any_id(value: str) -> bool:
    return bool(value)


@dataclass(frozen=True)
class CrmKind:
    """One kind of CRM, as the connector (outside its adapter) sees it."""

    name: str
    # How messages name it ("not a Salesforce id").
    label: str
    # The record field that holds the owner (the adapter's ``owner_field``).
    owner_field: str
    # The id column of an import file when ``--id-field`` is not given.
    id_field: str
    # ``intake_events.source`` of the events its webhook endpoint stores.
    intake_source: str
    # The form two ids (owners, records) are compared and stored in.
    id_key: Callable[[str], str]
    # Whether a string is a well-formed id of this CRM.
    is_id: Callable[[str], bool]
    # Ids have a fixed syntax: an import rejects rows whose id is not one, ``--to`` may name a
    # rep by CRM user id.
    typed_ids: bool
    # One record has several id forms (Salesforce's 15 and 18 characters): an intake event
    # keeps the form it arrived in, so looking one up compares the stored form's 18 (the
    # ``salesforce`` parameter of db/explain.sql).
    id_forms: bool
    # The calls the pipeline spends while leads trickle in (``connector.core.pacing``).
    pacing: Callable[[SalesforceCrm | HubSpotCrm], Pacing]
    # A new adapter for an org of this kind; the callable, when given, is the budget shared
    # with other processes, taken before each call (connector/core/budget.py).
    adapter: Callable[[OrgConfig, Callable[[], object] | None], CrmAdapter]
    # The calls the CRM allows in any 10 s for this org, when it counts per 10 s (HubSpot);
    # None when its budget counts per day (Salesforce).
    limit_per_10s: Callable[[SalesforceCrm | HubSpotCrm], int | None]
    # Record id prefixes by object (an id with another prefix is another object's).
    key_prefixes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def _salesforce_adapter(cfg: OrgConfig, budget: Callable[[], object] | None = None) -> CrmAdapter:
    from crm_adapters.salesforce import SalesforceAdapter, SalesforceSettings

    crm = cfg.crm
    assert isinstance(crm, SalesforceCrm)
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


def _hubspot_adapter(cfg: OrgConfig, budget: Callable[[], object] | None = None) -> CrmAdapter:
    from crm_adapters.hubspot import HubSpotAdapter, HubSpotSettings

    crm = cfg.crm
    assert isinstance(crm, HubSpotCrm)
    return HubSpotAdapter(
        HubSpotSettings(
            access_token=crm.auth.access_token.get_secret_value(),
            base_url=crm.base_url.rstrip("/"),
            object=crm.object,
            limit_per_10s=crm.limit_per_10s,
            extra_properties=tuple(cfg.read_fields),
            shared_budget=budget,
        )
    )


def _salesforce_pacing(crm: SalesforceCrm | HubSpotCrm) -> Pacing:
    """From the nominal budget: its reads are queries of up to a few hundred ids, its budget
    counts per day."""
    return pacing_for(NOMINAL_CALLS_PER_S)


def _hubspot_pacing(crm: SalesforceCrm | HubSpotCrm) -> Pacing:
    """From its ``limit_per_10s``, whole batch reads."""
    assert isinstance(crm, HubSpotCrm)
    return pacing_for(crm.limit_per_10s / 10.0, read_unit=HUBSPOT_BATCH_MAX)


SALESFORCE = CrmKind(
    name="salesforce",
    label="Salesforce",
    owner_field=SALESFORCE_OWNER_FIELD,
    id_field="Id",
    intake_source="salesforce_outbound",
    id_key=salesforce_id_key,
    is_id=salesforce_is_id,
    typed_ids=True,
    id_forms=True,
    pacing=_salesforce_pacing,
    adapter=_salesforce_adapter,
    limit_per_10s=lambda crm: None,
    key_prefixes=MappingProxyType({"Lead": "00Q", "Contact": "003"}),
)

HUBSPOT = CrmKind(
    name="hubspot",
    label="HubSpot",
    owner_field=HUBSPOT_OWNER_PROPERTY,
    id_field="id",
    intake_source="hubspot_webhook",
    id_key=_same,
    is_id=_any_id,
    typed_ids=False,
    id_forms=False,
    pacing=_hubspot_pacing,
    adapter=_hubspot_adapter,
    limit_per_10s=lambda crm: getattr(crm, "limit_per_10s", None),
)

CRM_KINDS: Mapping[str, CrmKind] = MappingProxyType({k.name: k for k in (SALESFORCE, HUBSPOT)})


def crm_kind(kind: str) -> CrmKind:
    """The descriptor of ``kind`` (a config's ``crm.kind``)."""
    try:
        return CRM_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown CRM kind {kind!r}") from None


def org_pacing(crm: SalesforceCrm | HubSpotCrm) -> Pacing:
    """The pacing of an org whose config's CRM section is ``crm``."""
    return crm_kind(crm.kind).pacing(crm)
