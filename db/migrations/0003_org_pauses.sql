-- An org whose CRM said "stop" (Salesforce REQUEST_LIMIT_EXCEEDED, HubSpot DAILY limit):
-- no dispatcher claims its outbox rows before `until`.
CREATE TABLE org_pauses (
    org        text PRIMARY KEY,
    until      timestamptz NOT NULL,
    reason     text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
