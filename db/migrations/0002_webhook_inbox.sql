-- HubSpot webhook events waiting for their record's fields to be fetched from the CRM.
-- A delivery commits its events here in one short transaction and is answered at once; a
-- worker claims rows (SKIP LOCKED, with a lease so a dead worker's claim is rescued), fetches
-- the records with no transaction open, then routes them and marks the rows done in one
-- transaction. HubSpot documents eventId as not guaranteed unique, so a repeat delivery is
-- recognised by (org, portal, event, object), which a distinct event never shares.

CREATE TABLE webhook_inbox (
    id           bigserial PRIMARY KEY,
    org          text NOT NULL,
    portal_id    bigint NOT NULL,
    event_id     bigint NOT NULL,
    object_id    bigint NOT NULL,
    crm_object   text NOT NULL,
    crm_id       text NOT NULL,
    occurred_at  bigint NOT NULL,
    -- The properties the events carried (fallback fields; the fetched record wins).
    fields       jsonb NOT NULL,
    state        text NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'claimed', 'done', 'skipped', 'dead')),
    attempts     integer NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL DEFAULT now(),
    claimed_by   text,
    lease_until  timestamptz,
    last_error   text,
    received_at  timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    UNIQUE (org, portal_id, event_id, object_id)
);
CREATE INDEX webhook_inbox_pending ON webhook_inbox (org, available_at, id) WHERE state = 'pending';
CREATE INDEX webhook_inbox_claimed ON webhook_inbox (lease_until) WHERE state = 'claimed';
