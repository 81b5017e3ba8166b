"""The sample org (acme: two teams on Salesforce) behind the ``sample_cfg`` and ``applied``
fixtures (tests/conftest.py), for the tests that parse it themselves."""

from __future__ import annotations

SAMPLE_YAML = """
org: acme
crm:
  kind: salesforce
  instance_url: https://acme.my.salesforce.com
  auth: {method: client_credentials, client_id: "${ACME_SF_ID}", client_secret: "${ACME_SF_SECRET}"}
  object: Lead
  outbound_secrets: ["${ACME_OM_SECRET}"]
intake_owner_ids: ["00G5g00000QueueEAB"]
teams:
  - name: na_ae
    members:
      - {crm_user_id: "0055g00000AbCdEAAV", name: Ada Lovelace, weight: 1}
      - {crm_user_id: "0055g00000AbCdFAAV", name: Alan Turing, weight: 2, active: true}
  - name: row_ae
    members:
      - {crm_user_id: "0055g00000AbCdGAAV", name: Grace Hopper}
      - {crm_user_id: "0055g00000AbCdHAAV", name: Edsger Dijkstra}
      - {crm_user_id: "0055g00000AbCdIAAV", name: Barbara Liskov}
rules:
  - {team: na_ae, when: {Country: [US, CA]}}
  - {team: row_ae}
"""
SAMPLE_ENV = {
    "ACME_SF_ID": "id-123",
    "ACME_SF_SECRET": "s3cret-value",
    "ACME_OM_SECRET": "om-url-secret-0123456789abcdef",
}
