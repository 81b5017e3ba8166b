-- The baseline: every table, index and constraint of the connector's schema. Versioned
-- migrations (this directory) change tables and indexes only; functions, views and triggers
-- live in db/functions/ and are applied on every `connector migrate` after these files
-- (connector/shell/store.py). A database recorded at an earlier version than this baseline
-- is refused (no release shipped one).

-- Routing state: teams, members, leads, assignments and the write-back outbox.

CREATE TABLE teams (
    id          bigserial PRIMARY KEY,
    org         text NOT NULL,
    name        text NOT NULL,
    -- Bumped by every routing-relevant membership edit; counts restart with each epoch.
    epoch       integer NOT NULL DEFAULT 1,
    fingerprint text NOT NULL DEFAULT '',
    in_config   boolean NOT NULL DEFAULT true,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org, name)
);

CREATE TABLE members (
    id                bigserial PRIMARY KEY,
    team_id           bigint NOT NULL REFERENCES teams (id),
    crm_user_id       text NOT NULL,
    name              text NOT NULL,
    weight            integer NOT NULL CHECK (weight > 0),
    active            boolean NOT NULL DEFAULT true,
    in_config         boolean NOT NULL DEFAULT true,
    position          integer NOT NULL,
    -- Leads this member got in the team's current epoch (the rotation's only state).
    assigned_in_epoch bigint NOT NULL DEFAULT 0,
    -- Turns credited to a rep that the rotation passed over (capped, off shift, or away under
    -- `catch_up: none`): its turns are assigned_in_epoch + credited_in_epoch. Reset with the
    -- epoch.
    credited_in_epoch bigint NOT NULL DEFAULT 0,
    UNIQUE (team_id, crm_user_id)
);

-- The members' ids in a table that is never updated, for assignments' foreign key to check
-- against: a members row is updated by every batch that picks its rep, and behind a held
-- snapshot the key's check per assigned lead would walk all of its versions. A new member's
-- row is written by the trigger members_add_key (db/functions/members.sql).
CREATE TABLE member_keys (
    id bigint PRIMARY KEY REFERENCES members (id) ON DELETE CASCADE ON UPDATE CASCADE
);

-- One lead per CRM record: Salesforce ids are stored in their 18-character form
-- (salesforce_id_18, db/functions/ids.sql); a lead that named the same record as an earlier
-- one points at it (merged_into) and is no longer live.
CREATE TABLE leads (
    id                bigserial PRIMARY KEY,
    org               text NOT NULL,
    crm_object        text NOT NULL,
    crm_id            text NOT NULL,
    fields            jsonb NOT NULL,
    parent_id         text,
    source            text NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    unassigned_reason text,
    merged_into       bigint REFERENCES leads (id)
);
CREATE UNIQUE INDEX leads_live_crm_id ON leads (org, crm_object, crm_id) WHERE merged_into IS NULL;
CREATE INDEX leads_received ON leads (received_at);
-- `connector status` (and the dashboard's totals page) counts every lead and assignment of an
-- org with index-only scans of small indexes (see db/status.sql): live leads of an org
-- (merged_into IS NULL), and the few merged ones, whose assignments the counts leave out.
CREATE INDEX leads_org_merged ON leads (org, merged_into);
-- The check a delete of a lead makes for leads merged into it.
CREATE INDEX leads_merged_into ON leads (merged_into) WHERE merged_into IS NOT NULL;

-- Who has each lead now. UNIQUE (lead_id): no lead can ever have two owners; a reassignment
-- copies the replaced row to assignment_history, with why it ended, and updates this one, in
-- one transaction that holds the row's lock.
CREATE TABLE assignments (
    id           bigserial PRIMARY KEY,
    lead_id      bigint NOT NULL UNIQUE REFERENCES leads (id),
    org          text NOT NULL,
    team_id      bigint NOT NULL REFERENCES teams (id),
    member_id    bigint NOT NULL REFERENCES member_keys (id),
    crm_user_id  text NOT NULL,
    epoch        integer NOT NULL,
    rule_index   integer NOT NULL,
    rule_name    text NOT NULL,
    source       text NOT NULL,
    assigned_at  timestamptz NOT NULL DEFAULT now(),
    -- How a lead under an account_owner rule was decided: the account it matched (result
    -- "matched"; the rotation did not advance), or why it fell back to the team rotation.
    -- NULL for leads routed by an ordinary rule.
    account_match jsonb,
    -- Why the lead has its current owner: routed (rule + rotation), rotated
    -- (`reassign --rotate`), reassigned (`reassign --to`), rep_deactivated, sla_expired.
    -- `note` is the operator's text.
    reason       text NOT NULL DEFAULT 'routed',
    note         text,
    -- When set, the poll checks the CRM at this time: a lead still in its initial status is
    -- re-routed once (reason sla_expired). Cleared when checked.
    sla_due_at   timestamptz
);
CREATE INDEX assignments_member ON assignments (member_id);
CREATE INDEX assignments_org ON assignments (org, team_id);
-- The team's latest owners, for `catch_up: {max_in_a_row: K}`.
CREATE INDEX assignments_team_recent ON assignments (team_id, id);
CREATE INDEX assignments_sla_due ON assignments (org, sla_due_at) WHERE sla_due_at IS NOT NULL;
-- Leads per rep in a time window, and the latest decisions (the dashboard): an index-only
-- range scan.
CREATE INDEX assignments_org_time ON assignments (org, assigned_at, id)
    INCLUDE (team_id, member_id);
-- Leads each member got through their account's owner (the rest of a member's leads are
-- counted from assignments_member).
CREATE INDEX assignments_account_matched ON assignments (member_id)
    WHERE account_match->>'result' = 'matched';

-- One row per owner write the CRM still has to see; written in the assignment's transaction.
CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    org           text NOT NULL,
    lead_id       bigint NOT NULL REFERENCES leads (id),
    assignment_id bigint NOT NULL REFERENCES assignments (id),
    crm_object    text NOT NULL,
    crm_id        text NOT NULL,
    owner_id      text NOT NULL,
    parent_id     text,
    state         text NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'claimed', 'sent', 'dead', 'superseded')),
    attempts      integer NOT NULL DEFAULT 0,
    available_at  timestamptz NOT NULL DEFAULT now(),
    claimed_by    text,
    lease_until   timestamptz,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    -- The owner the CRM had when a write was dropped as superseded (a person moved the
    -- record).
    found_owner   text,
    -- Owners the CRM may show because of our own earlier writes of this lead (the owner we
    -- last wrote, and writes that were in flight when a reassignment replaced them). The
    -- dispatcher writes over these and over intake owners, never over anyone else.
    replaces_owners text[] NOT NULL DEFAULT '{}',
    -- The lead's received_at, copied here when the row is written, so the dashboard's
    -- lead->CRM latency reads only the outbox rows of its window (NULL: the dashboard looks
    -- the lead up).
    lead_received_at timestamptz
);
-- Queue tables are vacuumed after a fixed number of dead rows, unthrottled.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
-- The claim reads pending rows in id order from a floor id up; claims in flight are read by
-- lease; no index holds claimed rows by state, so the finish statements look their rows up
-- by primary key.
CREATE INDEX outbox_pending ON outbox (org, id) WHERE state = 'pending';
CREATE INDEX outbox_leased ON outbox (org, lease_until) WHERE lease_until IS NOT NULL;
CREATE INDEX outbox_finished ON outbox (finished_at) WHERE state IN ('sent', 'superseded');
CREATE INDEX outbox_lead ON outbox (lead_id, id);
-- Dead and superseded rows, newest first (the dashboard).
CREATE INDEX outbox_org_state_id ON outbox (org, state, id) WHERE state <> 'claimed';
-- The oldest row the CRM has not seen yet.
CREATE INDEX outbox_open_age ON outbox (org, created_at) WHERE finished_at IS NULL;

-- An org whose CRM said "stop" (Salesforce REQUEST_LIMIT_EXCEEDED, HubSpot DAILY limit):
-- no dispatcher claims its outbox rows before `until`.
CREATE TABLE org_pauses (
    org        text PRIMARY KEY,
    until      timestamptz NOT NULL,
    reason     text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Where each org's scheduled poll has read up to (the CRM's last-modified time).
CREATE TABLE poll_watermarks (
    org        text PRIMARY KEY,
    watermark  timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

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
-- Queue tables are vacuumed after a fixed number of dead rows, unthrottled.
ALTER TABLE intake_events SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
-- The inbox claim reads pending events in id order from a floor id up; claims in flight are
-- read by lease.
CREATE INDEX intake_events_pending ON intake_events (org, id) WHERE state = 'pending';
CREATE INDEX intake_events_leased ON intake_events (org, lease_until) WHERE lease_until IS NOT NULL;
CREATE INDEX intake_events_finished ON intake_events (finished_at)
    WHERE state IN ('done', 'skipped');
-- A lead's explanation page: the pushes that named its record.
CREATE INDEX intake_events_record ON intake_events (org, crm_id);

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

-- Caps, working hours, time off and catch-up (the team lock serialises every pick).

-- Leads per member per day and per week (local dates in the team's time zone; a week starts
-- on its Monday), counted in the statement that records the assignments, under the team lock.
CREATE TABLE member_load (
    member_id bigint NOT NULL REFERENCES members (id),
    period    text NOT NULL CHECK (period IN ('day', 'week')),
    starts_on date NOT NULL,
    assigned  integer NOT NULL,
    PRIMARY KEY (member_id, period, starts_on)
);

-- Time off set from the command line (`connector rep away`), one row per rep of an org; the
-- rep gets no lead from starts_at until `until`. Read by every process at its next pick.
CREATE TABLE rep_time_off (
    org         text NOT NULL,
    crm_user_id text NOT NULL,
    starts_at   timestamptz NOT NULL,
    until       timestamptz NOT NULL,
    reason      text,
    set_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org, crm_user_id),
    CHECK (until > starts_at)
);

-- Lead-to-account matching (rules with `route_to: account_owner`): a mirror of the CRM's
-- Accounts (Salesforce) or Companies (HubSpot) with their owners and normalised domains,
-- refreshed by the poll from its own watermark (the CRM's last-modified time). Ids and owners
-- are stored in the form they are compared in (Salesforce: 18 characters).
CREATE TABLE crm_accounts (
    org         text NOT NULL,
    crm_id      text NOT NULL,
    owner_id    text,
    modified_at timestamptz NOT NULL,
    synced_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org, crm_id)
);

-- Every matchable registrable domain of an account (from its website and domain fields).
CREATE TABLE crm_account_domains (
    org    text NOT NULL,
    domain text NOT NULL,
    crm_id text NOT NULL,
    PRIMARY KEY (org, domain, crm_id),
    FOREIGN KEY (org, crm_id) REFERENCES crm_accounts (org, crm_id) ON DELETE CASCADE
);
CREATE INDEX crm_account_domains_account ON crm_account_domains (org, crm_id);

-- Where each org's account refresh has read up to.
CREATE TABLE account_watermarks (
    org        text PRIMARY KEY,
    watermark  timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Assignment history, reassignment, SLA re-route and recorded routing decisions.

-- Earlier owners, oldest first per lead; `ended_reason` is the reason of the assignment that
-- replaced this one.
CREATE TABLE assignment_history (
    id            bigserial PRIMARY KEY,
    assignment_id bigint NOT NULL REFERENCES assignments (id),
    lead_id       bigint NOT NULL REFERENCES leads (id),
    org           text NOT NULL,
    team_id       bigint NOT NULL REFERENCES teams (id),
    member_id     bigint NOT NULL REFERENCES members (id),
    crm_user_id   text NOT NULL,
    epoch         integer NOT NULL,
    reason        text NOT NULL,
    note          text,
    assigned_at   timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL DEFAULT now(),
    ended_reason  text NOT NULL
);
CREATE INDEX assignment_history_lead ON assignment_history (lead_id, id);

-- Every routing decision, written in the transaction that acts on it (never reconstructed):
-- the rules tried, the team, each candidate rep with its skip reason, the pick and its
-- standing in the rotation; reassignments and SLA checks likewise. `connector explain`
-- reads these. Retention removes the field values (`detail.values`) with the lead's fields.
CREATE TABLE routing_decisions (
    id      bigserial PRIMARY KEY,
    org     text NOT NULL,
    lead_id bigint NOT NULL REFERENCES leads (id),
    kind    text NOT NULL CHECK (kind IN ('route', 'reassign', 'sla')),
    detail  jsonb NOT NULL,
    made_at timestamptz NOT NULL DEFAULT now(),
    -- What the pick decided, as record_assignments writes it (NULL from every other writer,
    -- which keeps it in detail): read routing decisions through decision_details
    batch        bigint,
    epoch        integer,
    chosen_id    bigint,
    seat_ids     bigint[],
    seat_weights integer[],
    seat_counts  bigint[],
    seat_skips   text[]
);
CREATE INDEX routing_decisions_lead ON routing_decisions (lead_id, id);
CREATE INDEX routing_decisions_made ON routing_decisions (made_at);
