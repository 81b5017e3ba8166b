"""Build and share each org's CRM adapter (the connector's only way to reach a CRM)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from sqlalchemy import Engine

from connector.core.budget import SharedBudget
from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind
from crm_adapters.base import CrmAdapter


def adapter_for(cfg: OrgConfig, engine: Engine | None = None) -> CrmAdapter:
    """A new adapter for one org; every read returns the fields its rules need. With
    ``engine``, a CRM whose budget counts per 10 s (HubSpot) takes each call from the org's
    budget shared by every process through that database (connector/core/budget.py)."""
    kind = crm_kind(cfg.crm.kind)
    limit = kind.limit_per_10s(cfg.crm)
    budget = None
    if engine is not None and limit is not None:
        budget = SharedBudget(engine, cfg.org, limit).acquire
    return kind.adapter(cfg, budget)


class Adapters:
    """One adapter per org, built on first use and shared by the threads of this process."""

    def __init__(self, configs: Mapping[str, OrgConfig], engine: Engine | None = None) -> None:
        self.configs = configs
        self.engine = engine
        self._adapters: dict[str, CrmAdapter] = {}
        self._lock = threading.Lock()

    def get(self, org: str) -> CrmAdapter:
        with self._lock:
            if org not in self._adapters:
                self._adapters[org] = adapter_for(self.configs[org], self.engine)
            return self._adapters[org]
