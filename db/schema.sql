-- The full schema the migrations in db/migrations/ produce, in one file, for reading and for
-- building a database without migrating. tests/test_migrations.py checks that the two agree:
-- a new migration must update this file too (its tables here, and its row below).

CREATE TABLE schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO schema_migrations (version, name) VALUES
    (1, 'routing'),
    (2, 'webhook_inbox'),
    (3, 'org_pauses'),
    (4, 'poll_watermarks'),
    (5, 'trust'),
    (6, 'canonical_salesforce_ids'),
    (7, 'caps_availability'),
    (8, 'accounts'),
    (9, 'assignment_history'),
    (10, 'dashboard'),
    (11, 'queue_indexes'),
    (12, 'status_counts'),
    (13, 'outbox_lead_received_at');

-- 0001_routing.sql
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
    UNIQUE (team_id, crm_user_id)
);

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
    UNIQUE (org, crm_object, crm_id)
);

-- The audit of who got which lead. UNIQUE (lead_id): no lead can ever have two owners.
CREATE TABLE assignments (
    id          bigserial PRIMARY KEY,
    lead_id     bigint NOT NULL UNIQUE REFERENCES leads (id),
    org         text NOT NULL,
    team_id     bigint NOT NULL REFERENCES teams (id),
    member_id   bigint NOT NULL REFERENCES members (id),
    crm_user_id text NOT NULL,
    epoch       integer NOT NULL,
    rule_index  integer NOT NULL,
    rule_name   text NOT NULL,
    source      text NOT NULL,
    assigned_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX assignments_member ON assignments (member_id);
CREATE INDEX assignments_org ON assignments (org, team_id);

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
    finished_at   timestamptz
);
CREATE INDEX outbox_pending ON outbox (org, available_at, id) WHERE state = 'pending';
CREATE INDEX outbox_claimed ON outbox (lease_until) WHERE state = 'claimed';
CREATE INDEX outbox_org_state ON outbox (org, state);


-- 0002_webhook_inbox.sql
-- (its webhook_inbox table was replaced by intake_events in 0005_trust.sql)


-- 0003_org_pauses.sql
-- An org whose CRM said "stop" (Salesforce REQUEST_LIMIT_EXCEEDED, HubSpot DAILY limit):
-- no dispatcher claims its outbox rows before `until`.
CREATE TABLE org_pauses (
    org        text PRIMARY KEY,
    until      timestamptz NOT NULL,
    reason     text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);


-- 0004_poll_watermarks.sql
-- Where each org's scheduled poll has read up to (the CRM's last-modified time).
CREATE TABLE poll_watermarks (
    org        text PRIMARY KEY,
    watermark  timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);


-- 0005_trust.sql
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


-- 0006_canonical_salesforce_ids.sql
-- One lead per Salesforce record: ids are stored in their 18-character form; a lead that
-- named the same record as an earlier one points at it (merged_into) and is no longer live.
-- (The migration also converts and merges existing rows; a new database has none.)

-- The 18-character form of a 15- or 18-character Salesforce id; anything else unchanged.
-- An 18-character id's own suffix decides the case of its first 15 characters (it may have
-- been case-folded on the way). Case is changed with translate(), not upper()/lower(), so the
-- database's collation cannot matter.
CREATE FUNCTION salesforce_id_18(value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    alphabet constant text := 'ABCDEFGHIJKLMNOPQRSTUVWXYZ012345';
    lowers   constant text := 'abcdefghijklmnopqrstuvwxyz';
    uppers   constant text := 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';
    id15     text := '';
    suffix   text := '';
    ch       text;
    bits     integer;
BEGIN
    IF value !~ '^[A-Za-z0-9]{15}([A-Za-z0-9]{3})?$' THEN
        RETURN value;
    END IF;
    IF length(value) = 15 THEN
        id15 := value;
    ELSE
        FOR chunk IN 0..2 LOOP
            bits := strpos(alphabet, translate(substr(value, 16 + chunk, 1), lowers, uppers)) - 1;
            IF bits < 0 THEN
                RETURN value;  -- not a suffix character
            END IF;
            FOR i IN 0..4 LOOP
                ch := substr(value, chunk * 5 + i + 1, 1);
                IF (bits >> i) & 1 = 1 THEN
                    IF ch ~ '^[0-9]$' THEN
                        RETURN value;  -- the suffix marks a digit upper case
                    END IF;
                    id15 := id15 || translate(ch, lowers, uppers);
                ELSE
                    id15 := id15 || translate(ch, uppers, lowers);
                END IF;
            END LOOP;
        END LOOP;
    END IF;
    FOR chunk IN 0..2 LOOP
        bits := 0;
        FOR i IN 0..4 LOOP
            IF strpos(uppers, substr(id15, chunk * 5 + i + 1, 1)) > 0 THEN
                bits := bits | (1 << i);
            END IF;
        END LOOP;
        suffix := suffix || substr(alphabet, bits + 1, 1);
    END LOOP;
    RETURN id15 || suffix;
END
$$;

ALTER TABLE leads ADD COLUMN merged_into bigint REFERENCES leads (id);
ALTER TABLE leads DROP CONSTRAINT leads_org_crm_object_crm_id_key;
CREATE UNIQUE INDEX leads_live_crm_id ON leads (org, crm_object, crm_id) WHERE merged_into IS NULL;


-- 0007_caps_availability.sql
-- Caps, working hours, time off and catch-up (the team lock still serialises every pick).

-- Turns credited to a rep that the rotation passed over (capped, off shift, or away under
-- `catch_up: none`): its turns are assigned_in_epoch + credited_in_epoch. Reset with the epoch.
ALTER TABLE members ADD COLUMN credited_in_epoch bigint NOT NULL DEFAULT 0;

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

-- The team's latest owners, for `catch_up: {max_in_a_row: K}`.
CREATE INDEX assignments_team_recent ON assignments (team_id, id);


-- 0008_accounts.sql
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

-- How a lead under an account_owner rule was decided, written with its assignment: the
-- account it matched (result "matched"; the rotation did not advance), or why it fell back to
-- the team rotation. NULL for leads routed by an ordinary rule.
ALTER TABLE assignments ADD COLUMN account_match jsonb;


-- 0009_assignment_history.sql
-- Assignment history, reassignment, SLA re-route and recorded routing decisions.
-- `assignments` keeps exactly one row per lead: its CURRENT owner (UNIQUE (lead_id), so the
-- database itself refuses a second current owner). A reassignment copies the replaced row to
-- `assignment_history`, with why it ended, and updates the current row, in one transaction
-- that holds the row's lock.

-- Why the lead has its current owner: routed (rule + rotation), rotated (`reassign --rotate`),
-- reassigned (`reassign --to`), rep_deactivated, sla_expired. `note` is the operator's text.
ALTER TABLE assignments ADD COLUMN reason text NOT NULL DEFAULT 'routed';
ALTER TABLE assignments ADD COLUMN note text;
-- When set, the poll checks the CRM at this time: a lead still in its initial status is
-- re-routed once (reason sla_expired). Cleared when checked.
ALTER TABLE assignments ADD COLUMN sla_due_at timestamptz;
CREATE INDEX assignments_sla_due ON assignments (org, sla_due_at) WHERE sla_due_at IS NOT NULL;

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
    made_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX routing_decisions_lead ON routing_decisions (lead_id, id);
CREATE INDEX routing_decisions_made ON routing_decisions (made_at);

-- Owners the CRM may show because of our own earlier writes of this lead (the owner we last
-- wrote, and writes that were in flight when a reassignment replaced them). The dispatcher
-- writes over these and over intake owners, never over anyone else.
ALTER TABLE outbox ADD COLUMN replaces_owners text[] NOT NULL DEFAULT '{}';
CREATE INDEX outbox_lead ON outbox (lead_id, id);


-- The operator's dashboard reads windows of recent activity; these indexes keep its queries
-- off full scans however many leads are stored. Nothing new is recorded: the lead->CRM
-- latency is leads.received_at to outbox.finished_at of the 'sent' row.

-- Leads per rep in a time window, and the latest decisions: an index-only range scan.
CREATE INDEX assignments_org_time ON assignments (org, assigned_at, id)
    INCLUDE (team_id, member_id);
-- Dead and superseded rows, newest first (replaces the (org, state) index, of which it is
-- a prefix-compatible superset).
DROP INDEX outbox_org_state;
CREATE INDEX outbox_org_state_id ON outbox (org, state, id);
-- The oldest row the CRM has not seen yet.
CREATE INDEX outbox_open_age ON outbox (org, created_at) WHERE state IN ('pending', 'claimed');
-- A lead's explanation page: the pushes that named its record (its outbox rows use
-- outbox_lead, made by 0009).
CREATE INDEX intake_events_record ON intake_events (org, crm_id);


-- 0011_queue_indexes.sql
-- Queue lookups that stay cheap when VACUUM cannot keep up (a long transaction holds its
-- snapshot): the claim's "is this parent in another claim in flight?" test looks rows up by
-- parent, so it reads only that parent's row versions instead of every version that was ever
-- 'claimed' (all of them are, once) through outbox_org_state.
CREATE INDEX outbox_claimed_parent ON outbox (org, parent_id) WHERE state = 'claimed';


-- 0012_status_counts.sql
-- `connector status` (and the dashboard's totals page) counts every lead and assignment of an
-- org. These indexes let each count be an index-only scan of a small index instead of a join
-- of leads and assignments (37 s at 1,000,000 leads): see db/status.sql and BENCHMARKS.md.

-- Live leads of an org (merged_into IS NULL: one deduplicated key, a few MB per million
-- leads), and the few merged ones, whose assignments the counts leave out.
CREATE INDEX leads_org_merged ON leads (org, merged_into);
-- Leads each member got through their account's owner (the rest of a member's leads are
-- counted from assignments_member).
CREATE INDEX assignments_account_matched ON assignments (member_id)
    WHERE account_match->>'result' = 'matched';


-- 0013_outbox_lead_received_at.sql
-- The lead's received_at, copied onto each outbox row when it is written (the statements that
-- write outbox rows read the lead anyway), so the dashboard's lead->CRM latency reads only
-- the outbox rows of its window instead of looking up every one's lead by primary key (31,000
-- lookups a day at 1,000,000 leads). Rows written before this migration have NULL here; the
-- dashboard looks their lead up as before.
ALTER TABLE outbox ADD COLUMN lead_received_at timestamptz;
