"""Build and share each org's CRM adapter (the connector's only way to reach a CRM)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from connector.core.config import OrgConfig
from connector.core.crm_kinds import crm_kind
from crm_adapters.base import CrmAdapter


def adapter_for(cfg: OrgConfig) -> CrmAdapter:
    """A new adapter for one org; every read returns the fields its rules need."""
    return crm_kind(cfg.crm.kind).adapter(cfg)


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
