-- The CRM is the system of record: pushes are hints, every record is read back before it is
-- routed, and owner writes are checked against the CRM's current owner.

-- Every push (Salesforce Outbound Message notification, HubSpot webhook event) is committed
-- here with its record id only, in one short transaction, and answered at once. A worker
-- claims rows (SKIP LOCKED, under a lease so a dead worker's claim is rescued), reads the
-- records from the CRM with no transaction open, then routes them or records why not, and
-- marks the rows in one transaction. `event_key` makes a redelivery a no-op: the
-- notification id (Salesforce), or portal:event:object (HubSpot, whose eventId alone is not
-- guaranteed unique).
CREATE TABLE intake_events (
    id           bigserial PRIMARY KEY,
    org          text NOT NULL,
    source       text NOT NULL CHECK (source IN ('salesforce_outbound', 'hubspot_webhook')),
    event_key    text NOT NULL,
    crm_object   text NOT NULL,
    crm_id       text NOT NULL,
    state        text NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'claimed', 'done', 'skipped', 'dead')),
    attempts     integer NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL DEFAULT now(),
    claimed_by   text,
    lease_until  timestamptz,
    last_error   text,
    received_at  timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    UNIQUE (org, event_key)
);
CREATE INDEX intake_events_pending ON intake_events (org, available_at, id)
    WHERE state = 'pending';
CREATE INDEX intake_events_claimed ON intake_events (lease_until) WHERE state = 'claimed';
CREATE INDEX intake_events_finished ON intake_events (finished_at)
    WHERE state IN ('done', 'skipped');

-- HubSpot events still waiting in the old inbox move over (their carried fields are not:
-- fields now come from the CRM read).
INSERT INTO intake_events (org, source, event_key, crm_object, crm_id, state, attempts,
                           available_at, last_error, received_at, finished_at)
SELECT org, 'hubspot_webhook', portal_id || ':' || event_id || ':' || object_id, crm_object,
       crm_id, CASE WHEN state = 'claimed' THEN 'pending' ELSE state END, attempts,
       available_at, last_error, received_at, finished_at
FROM webhook_inbox;
DROP TABLE webhook_inbox;

-- Records the connector was asked to route (a push or an import) and did not, because the
-- CRM said no: not found, another object, or already owned by a person. One row per record,
-- with the latest reason; no outbox row and no rotation count were made for it.
CREATE TABLE skipped_records (
    org           text NOT NULL,
    crm_object    text NOT NULL,
    crm_id        text NOT NULL,
    reason        text NOT NULL,
    owner_found   text,
    source        text NOT NULL,
    times         integer NOT NULL DEFAULT 1,
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org, crm_object, crm_id)
);
CREATE INDEX skipped_records_seen ON skipped_records (last_seen_at);

-- The owner the CRM had when a write was dropped as superseded (a person moved the record).
ALTER TABLE outbox ADD COLUMN found_owner text;
CREATE INDEX outbox_finished ON outbox (finished_at) WHERE state IN ('sent', 'superseded');
CREATE INDEX leads_received ON leads (received_at);
