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
    (13, 'outbox_lead_received_at'),
    (14, 'route_lead'),
    (15, 'queue_autovacuum'),
    (16, 'catch_up_heavy_reps'),
    (17, 'inbox_claim_floor'),
    (18, 'claim_paths'),
    (19, 'route_lead_plain'),
    (20, 'route_plain'),
    (21, 'route_plain_one_pass'),
    (22, 'decision_columns'),
    (23, 'route_plain_one_sort'),
    (24, 'lock_team_seats'),
    (25, 'route_plain_batch'),
    (26, 'member_keys'),
    (27, 'validate_member_keys');

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
    member_id   bigint NOT NULL,  -- REFERENCES member_keys (id): see 0026 below
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
    made_at timestamptz NOT NULL DEFAULT now(),
    -- 0022: what the pick decided, as route_plain writes it (NULL from every other writer,
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

-- 0022: routing_decisions as readers see them, one detail whoever wrote the row.
CREATE VIEW decision_details AS
SELECT d.id, d.org, d.lead_id, d.kind, d.made_at,
       CASE WHEN d.seat_ids IS NULL THEN d.detail
            ELSE d.detail || jsonb_build_object(
                     'batch', d.batch, 'epoch', d.epoch, 'chosen_id', d.chosen_id,
                     'seats', jsonb_build_object('ids', d.seat_ids, 'weights', d.seat_weights,
                                                 'counts', d.seat_counts,
                                                 'skips', d.seat_skips))
       END AS detail
FROM routing_decisions d;

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


-- 0014_route_lead.sql
-- One round trip per lead: the common single-lead assignment as one server-side call.
-- `route_lead` inserts the lead, locks its team row, reads the members with their turns,
-- CLI time off and caps counters, picks with `rotation_pick` (a mirror of
-- connector/routing/rotation.py `pick_available` for one lead, property-tested against it),
-- records the assignment, counts, credits, caps counters, outbox row and decision, and
-- returns the outcome: the team row stays locked for this one statement plus the commit.
-- It is VOLATILE plpgsql, so at READ COMMITTED each statement inside takes a fresh snapshot:
-- the member read that follows the lock sees what the previous lock holder committed
-- (tests/test_route_lead.py checks this). What only the config knows (working hours and YAML
-- time off at the caller's `now`, the caps' values, the rules tried) is computed by the
-- caller before the call and passed in.

-- One pick of the weighted Pfair rotation (earliest deadline first) over a team's ACTIVE
-- seats, with caps, credits and catch-up, exactly as pick_available picks one lead.
-- blocked: 'away' or 'off_shift' (NULL: may take a lead); room: leads its caps still allow
-- (NULL: no cap); max_in_a_row: K of catch_up, NULL for catch_up none; recent: the team's
-- latest owners, newest first. Returns the pick (NULL: nobody can take the lead), every seat
-- in rotation order with its skip reason (and its weight and turns, for the decision), and
-- the turns credited to passed-over seats.
CREATE FUNCTION rotation_pick(
    ids bigint[], weights integer[], turns bigint[], positions integer[], blocked text[],
    room integer[], max_in_a_row integer, recent bigint[],
    OUT member_id bigint, OUT cand_ids bigint[], OUT cand_skips text[],
    OUT credit_ids bigint[], OUT credit_ns bigint[],
    OUT cand_weights integer[], OUT cand_turns bigint[]
)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    n      integer := coalesce(array_length(ids, 1), 0);
    ord    integer[];
    t      bigint[] := turns;
    why    text[];
    credit boolean[];
    gave   bigint[];
    total  bigint := 0;
    slot   bigint := 0;
    able   integer := 0;
    excl   integer;
    best   integer;
    dl     bigint;
    best_dl bigint;
    i      integer;
BEGIN
    cand_ids := '{}'; cand_skips := '{}'; credit_ids := '{}'; credit_ns := '{}';
    cand_weights := '{}'; cand_turns := '{}';
    IF n = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg(x.i ORDER BY weights[x.i] DESC, positions[x.i], ids[x.i]) INTO ord
    FROM generate_subscripts(ids, 1) AS x (i);
    why := array_fill(NULL::text, ARRAY[n]);
    credit := array_fill(false, ARRAY[n]);
    gave := array_fill(0::bigint, ARRAY[n]);
    FOREACH i IN ARRAY ord LOOP
        total := total + weights[i];
        slot := slot + t[i];
        why[i] := coalesce(blocked[i], CASE WHEN room[i] = 0 THEN 'capped' END);
        credit[i] := why[i] IN ('capped', 'off_shift')
                     OR (why[i] = 'away' AND max_in_a_row IS NULL);
        IF why[i] IS NULL THEN
            able := able + 1;
        END IF;
        cand_ids := cand_ids || ids[i];
        cand_skips := cand_skips || why[i];
        cand_weights := cand_weights || weights[i];
        cand_turns := cand_turns || turns[i];
    END LOOP;
    IF able = 0 THEN
        RETURN;
    END IF;
    -- catch-up: no (K+1)-th lead in a row while another rep can take it, unless that rep is
    -- already ahead of its share, or its share is more than K of every K+1 leads (then K
    -- would hold it below its share for ever: it follows the plain rotation)
    IF max_in_a_row IS NOT NULL AND able > 1
       AND coalesce(array_length(recent, 1), 0) >= max_in_a_row
       AND recent[1:max_in_a_row] <@ ARRAY[recent[1]] THEN
        excl := array_position(ids, recent[1]);
        IF excl IS NOT NULL
           AND NOT (why[excl] IS NULL AND slot * weights[excl] >= t[excl] * total
                    AND max_in_a_row * total >= (max_in_a_row + 1) * weights[excl]) THEN
            excl := NULL;
        END IF;
    END IF;
    LOOP
        best := NULL;
        FOREACH i IN ARRAY ord LOOP
            CONTINUE WHEN i = excl OR NOT (why[i] IS NULL OR credit[i])
                          OR t[i] * total / weights[i] > slot;
            dl := ((t[i] + 1) * total + weights[i] - 1) / weights[i];
            IF best IS NULL OR dl < best_dl THEN
                best := i;
                best_dl := dl;
            END IF;
        END LOOP;
        IF best IS NOT NULL THEN
            IF credit[best] THEN  -- passed over: its turn is credited, the schedule moves on
                t[best] := t[best] + 1;
                gave[best] := gave[best] + 1;
                slot := slot + 1;
                CONTINUE;
            END IF;
        ELSE  -- the away reps' share is not consumed: serve the earliest deadline
            FOREACH i IN ARRAY ord LOOP
                CONTINUE WHEN i = excl OR why[i] IS NOT NULL;
                dl := ((t[i] + 1) * total + weights[i] - 1) / weights[i];
                IF best IS NULL OR dl < best_dl THEN
                    best := i;
                    best_dl := dl;
                END IF;
            END LOOP;
        END IF;
        EXIT;
    END LOOP;
    member_id := ids[best];
    FOREACH i IN ARRAY ord LOOP
        IF gave[i] > 0 THEN
            credit_ids := credit_ids || ids[i];
            credit_ns := credit_ns || gave[i];
        END IF;
    END LOOP;
END
$$;

-- Same columns as rotation_pick; ids/weights/turns/positions describe the ACTIVE seats.
-- Seats in rotation order (heavier first, then position, then id); the pick: released seats
-- (turns * total / weight <= the turns given so far) before the others, then the earliest
-- deadline, then rotation order (rotation_pick keeps the first of equal deadlines).
CREATE FUNCTION rotation_pick_plain(
    ids bigint[], weights integer[], turns bigint[], positions integer[]
)
RETURNS TABLE (
    member_id bigint, cand_ids bigint[], cand_skips text[], credit_ids bigint[],
    credit_ns bigint[], cand_weights integer[], cand_turns bigint[]
)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    WITH s AS (
        SELECT u.id, u.w, u.t, row_number() OVER (ORDER BY u.w DESC, u.p, u.id) AS k
        FROM unnest(ids, weights, turns, positions) AS u (id, w, t, p)
    ), total AS (
        SELECT CAST(sum(s.w) AS bigint) AS w, CAST(sum(s.t) AS bigint) AS slot FROM s
    )
    SELECT (SELECT s.id FROM s, total
            ORDER BY s.t * total.w / s.w > total.slot,
                     ((s.t + 1) * total.w + s.w - 1) / s.w, s.k
            LIMIT 1),
           coalesce(array_agg(s.id ORDER BY s.k), '{}'),
           array_fill(NULL::text, ARRAY[CAST(count(*) AS integer)]),
           CAST('{}' AS bigint[]), CAST('{}' AS bigint[]),
           coalesce(array_agg(s.w ORDER BY s.k), '{}'),
           coalesce(array_agg(s.t ORDER BY s.k), '{}')
    FROM s
$$;

-- Assign one new lead of a rotation rule (no overflow team): see 0014_route_lead.sql above.
-- users/blocked/per_day/per_week describe the configured members (by CRM user id); a member
-- row the config does not name gets the team's caps (team_per_day, team_per_week).
-- Returns status 'assigned', 'unassigned' (reason set), 'duplicate' (the stored outcome of
-- the existing lead) or 'no_team' (nothing written: the team is not in the database).
CREATE FUNCTION route_lead(
    p_org text, p_crm_object text, p_source text, p_crm_id text, p_fields jsonb,
    p_parent_id text, p_team text, p_rule_index integer, p_rule_name text,
    p_now timestamptz, p_day date, p_week date,
    p_users text[], p_blocked text[], p_per_day integer[], p_per_week integer[],
    p_team_per_day integer, p_team_per_week integer, p_max_in_a_row integer,
    p_detail jsonb, p_sla_minutes integer
)
RETURNS TABLE (
    status text, lead_id bigint, team text, owner_id text, owner_name text, reason text,
    cand_ids bigint[], cand_skips text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_lead    bigint;
    v_received timestamptz;
    v_team    bigint;
    v_epoch   integer;
    m         record;
    v_reason  text;
    v_weights integer[];
    v_counts  bigint[];
    v_owner   text;
    v_name    text;
    v_detail  jsonb;
    v_recent  bigint[] := '{}';
    v_has_team boolean;
    v_member  bigint;
BEGIN
    team := p_team;
    PERFORM FROM teams t WHERE t.org = p_org AND t.name = p_team AND t.in_config;
    v_has_team := FOUND;
    IF v_has_team THEN
        INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
        VALUES (p_org, p_crm_object, p_crm_id, p_fields, p_parent_id, p_source)
        ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING
        RETURNING id, received_at INTO v_lead, v_received;
    END IF;
    IF v_lead IS NULL THEN
        -- A repeat gets its stored outcome, even when its team left the database, as on the
        -- general path (which never looks at the team of a lead it already has).
        SELECT l.id, a.crm_user_id, t.name, mm.name,
               CASE WHEN a.crm_user_id IS NULL THEN l.unassigned_reason END
        INTO lead_id, owner_id, team, owner_name, reason
        FROM leads l
        LEFT JOIN assignments a ON a.lead_id = l.id
        LEFT JOIN teams t ON t.id = a.team_id
        LEFT JOIN members mm ON mm.id = a.member_id
        WHERE l.org = p_org AND l.crm_object = p_crm_object AND l.crm_id = p_crm_id
          AND l.merged_into IS NULL;
        IF FOUND OR v_has_team THEN
            status := 'duplicate';
        ELSE  -- nothing written
            status := 'no_team';
            team := p_team;
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    lead_id := v_lead;
    SELECT t.id, t.epoch INTO v_team, v_epoch
    FROM teams t WHERE t.org = p_org AND t.name = p_team AND t.in_config FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'team of org is no longer in the database' USING ERRCODE = 'P0002';
    END IF;
    -- catch-up's latest owners, newest first, read after the lock (a fresh snapshot). Not
    -- in the member read below, and not with LIMIT K: a LIMIT that is a parameter is unknown
    -- to a generic plan, which the planner then costs by the size of `assignments`, and it
    -- re-plans the statement on every call (the header of migration 0019). The constant
    -- LIMIT is the largest K (config.py MAX_IN_A_ROW): with it the generic plan reads the
    -- team's index backwards (without it, a sort of the team's whole history), and the loop
    -- stops after K.
    IF p_max_in_a_row IS NOT NULL THEN
        FOR v_member IN
            SELECT a.member_id FROM assignments a WHERE a.team_id = v_team
            ORDER BY a.id DESC LIMIT 1000
        LOOP
            v_recent := v_recent || v_member;
            EXIT WHEN cardinality(v_recent) >= p_max_in_a_row;
        END LOOP;
    END IF;
    -- A new statement, so a fresh snapshot: the counts and caps counters the previous lock
    -- holder committed. The pick is made in the same statement.
    SELECT x.*, p.member_id AS pick, p.cand_ids AS seat_ids, p.cand_skips AS seat_skips,
           p.cand_weights AS seat_weights, p.cand_turns AS seat_turns, p.credit_ids, p.credit_ns,
           x.users[array_position(x.ids, p.member_id)] AS owner,
           x.names[array_position(x.ids, p.member_id)] AS owner_name
    INTO m
    FROM (
        -- every array is aggregated from the same row stream, so they stay aligned; the
        -- rotation sorts its seats itself
        SELECT array_agg(y.id) AS ids, array_agg(y.weight) AS weights,
               array_agg(y.turns) AS turns, array_agg(y.active) AS active,
               array_agg(y.crm_user_id) AS users, array_agg(y.name) AS names,
               array_agg(y.position) AS positions,
               -- reps away by `connector rep away` now, sorted by code point (as Python sorts)
               coalesce(array_agg(y.crm_user_id ORDER BY y.crm_user_id COLLATE "C")
                        FILTER (WHERE y.away_cmd), '{}') AS away_cmd,
               coalesce(array_agg(y.id) FILTER (WHERE y.active), '{}') AS s_ids,
               coalesce(array_agg(y.weight) FILTER (WHERE y.active), '{}') AS s_weights,
               coalesce(array_agg(y.turns) FILTER (WHERE y.active), '{}') AS s_turns,
               coalesce(array_agg(y.position) FILTER (WHERE y.active), '{}') AS s_positions,
               coalesce(array_agg(y.why) FILTER (WHERE y.active), '{}') AS s_why,
               coalesce(array_agg(y.room) FILTER (WHERE y.active), '{}') AS s_room,
               -- nothing to skip or credit and no catch-up: the plain rotation's pick
               p_max_in_a_row IS NULL
               AND coalesce(bool_and(y.why IS NULL AND coalesce(y.room, 1) > 0)
                            FILTER (WHERE y.active), true) AS plain
        FROM (
            SELECT mb.id, mb.weight, mb.assigned_in_epoch + mb.credited_in_epoch AS turns,
                   mb.position, mb.active, mb.crm_user_id, mb.name,
                   CASE WHEN o.starts_at <= p_now AND p_now < o.until THEN 'away'
                        ELSE p_blocked[c.i] END AS why,
                   coalesce(o.starts_at <= p_now AND p_now < o.until, false) AS away_cmd,
                   CASE WHEN cap.day IS NOT NULL OR cap.week IS NOT NULL THEN
                   greatest(0, least(cap.day - coalesce(d.assigned, 0),
                                     cap.week - coalesce(w.assigned, 0))) END AS room
            FROM members mb
            CROSS JOIN LATERAL (SELECT array_position(p_users, mb.crm_user_id) AS i) c
            -- a member the config does not name has the team's caps; NULL: no cap (least
            -- and greatest skip NULLs, so a NULL room is left only when neither is set)
            CROSS JOIN LATERAL (
                SELECT CASE WHEN c.i IS NULL THEN p_team_per_day ELSE p_per_day[c.i] END AS day,
                       CASE WHEN c.i IS NULL THEN p_team_per_week ELSE p_per_week[c.i] END
                           AS week
            ) cap
            -- time off set from the command line, looked up only when the org has some
            LEFT JOIN LATERAL (
                SELECT t.starts_at, t.until FROM rep_time_off t
                WHERE (SELECT EXISTS (SELECT FROM rep_time_off a WHERE a.org = p_org))
                  AND t.org = p_org AND t.crm_user_id = mb.crm_user_id
            ) o ON true
            -- a count is read only for a cap that is set (the test gates the index probe)
            LEFT JOIN LATERAL (
                SELECT l.assigned FROM member_load l
                WHERE cap.day IS NOT NULL
                  AND l.member_id = mb.id AND l.period = 'day' AND l.starts_on = p_day
            ) d ON true
            LEFT JOIN LATERAL (
                SELECT l.assigned FROM member_load l
                WHERE cap.week IS NOT NULL
                  AND l.member_id = mb.id AND l.period = 'week' AND l.starts_on = p_week
            ) w ON true
            WHERE mb.team_id = v_team AND mb.in_config
        ) y
    ) x
    -- only one arm runs: each is gated by x.plain (a one-time filter)
    CROSS JOIN LATERAL (
        SELECT * FROM rotation_pick_plain(x.s_ids, x.s_weights, x.s_turns, x.s_positions)
        WHERE x.plain
        UNION ALL
        SELECT * FROM rotation_pick(
            x.s_ids, x.s_weights, x.s_turns, x.s_positions, x.s_why, x.s_room,
            p_max_in_a_row, v_recent)
        WHERE NOT x.plain
    ) p;
    v_owner := m.owner;
    v_name := m.owner_name;
    -- Every configured member as the decision records it (the rotation's seats in its
    -- order, then the inactive ones by position), with its weight and count, compactly:
    -- connector/routing/decisions.py `expand` turns this into the full form for explain.
    cand_ids := m.seat_ids;
    cand_skips := m.seat_skips;
    v_weights := m.seat_weights;
    v_counts := m.seat_turns;
    IF false = ANY (m.active) THEN
        SELECT cand_ids || array_agg(u.id ORDER BY u.p),
               cand_skips || array_agg('inactive'::text ORDER BY u.p),
               v_weights || array_agg(u.w ORDER BY u.p),
               v_counts || array_agg(u.t ORDER BY u.p)
        INTO cand_ids, cand_skips, v_weights, v_counts
        FROM unnest(m.ids, m.active, m.positions, m.weights, m.turns) u (id, a, p, w, t)
        WHERE NOT u.a;
    END IF;
    v_detail := p_detail || jsonb_build_object(
        'batch', v_lead,
        'team', p_team,
        'seats', jsonb_build_object('ids', cand_ids, 'weights', v_weights, 'counts', v_counts,
                                    'skips', cand_skips))
        || CASE WHEN cardinality(m.away_cmd) > 0
                THEN jsonb_build_object('away_by_command', m.away_cmd) ELSE '{}'::jsonb END;
    IF m.pick IS NULL THEN
        v_reason := CASE
            WHEN NOT (true = ANY (coalesce(m.active, '{}'))) THEN 'no_active_member'
            WHEN 'capped' = ANY (m.seat_skips) THEN 'all_capped'
            ELSE 'none_available' END;
        UPDATE leads SET unassigned_reason = v_reason WHERE id = v_lead;
        INSERT INTO routing_decisions (org, lead_id, kind, detail)
        VALUES (p_org, v_lead, 'route',
                v_detail || jsonb_build_object('outcome', 'unassigned', 'reason', v_reason));
        status := 'unassigned';
        reason := v_reason;
        RETURN NEXT;
        RETURN;
    END IF;
    -- every write in one statement (like record_assignments and record_decisions)
    WITH bump AS (
        -- the pick and the credited seats, by primary key (a join with the credits was
        -- planned as a scan of every member of every team)
        UPDATE members mb
        SET assigned_in_epoch = mb.assigned_in_epoch
                                + CASE WHEN mb.id = m.pick THEN 1 ELSE 0 END,
            credited_in_epoch = mb.credited_in_epoch
                                + coalesce(m.credit_ns[array_position(m.credit_ids, mb.id)], 0)
        WHERE mb.id = ANY (m.pick || m.credit_ids)
        RETURNING mb.id
    ), load AS (
        INSERT INTO member_load (member_id, period, starts_on, assigned)
        VALUES (m.pick, 'day', p_day, 1), (m.pick, 'week', p_week, 1)
        ON CONFLICT (member_id, period, starts_on)
        DO UPDATE SET assigned = member_load.assigned + 1
        RETURNING member_id
    ), assigned AS (
        INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at)
        VALUES (v_lead, p_org, v_team, m.pick, v_owner, v_epoch, p_rule_index,
                p_rule_name, p_source, now() + make_interval(mins => p_sla_minutes))
        RETURNING id
    ), outbox AS (
        INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id,
                            parent_id, lead_received_at)
        SELECT p_org, v_lead, assigned.id, p_crm_object, p_crm_id, v_owner, p_parent_id,
               v_received
        FROM assigned
        RETURNING id
    )
    INSERT INTO routing_decisions (org, lead_id, kind, detail)
    VALUES (p_org, v_lead, 'route',
            v_detail || jsonb_build_object('epoch', v_epoch, 'outcome', 'assigned',
                                           'chosen_id', m.pick)
            || CASE WHEN p_sla_minutes IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('sla_minutes', p_sla_minutes) END);
    status := 'assigned';
    owner_id := v_owner;
    owner_name := v_name;
    RETURN NEXT;
END
$$;

-- 0015_queue_autovacuum.sql
-- Queue tables are vacuumed after a fixed number of dead rows, unthrottled.
ALTER TABLE intake_events SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

-- 0016_catch_up_heavy_reps.sql
-- rotation_pick (above, as it now reads): K applies only to reps whose share is at most K of
-- every K+1 leads.

-- 0017_inbox_claim_floor.sql
-- The inbox claim reads pending events in id order from a floor id up: its index is in id
-- order (it replaces the one created above).
DROP INDEX intake_events_pending;
CREATE INDEX intake_events_pending ON intake_events (org, id) WHERE state = 'pending';

-- 0018_claim_paths.sql
-- The outbox claim reads pending rows in id order from a floor id up; claims in flight are
-- read by lease; no index holds claimed rows by state, so the finish statements look their
-- rows up by primary key (they replace the indexes created above).
DROP INDEX outbox_pending;
CREATE INDEX outbox_pending ON outbox (org, id) WHERE state = 'pending';
DROP INDEX outbox_claimed;
DROP INDEX outbox_claimed_parent;
CREATE INDEX outbox_leased ON outbox (org, lease_until) WHERE lease_until IS NOT NULL;
DROP INDEX outbox_open_age;
CREATE INDEX outbox_open_age ON outbox (org, created_at) WHERE finished_at IS NULL;
DROP INDEX intake_events_claimed;
CREATE INDEX intake_events_leased ON intake_events (org, lease_until) WHERE lease_until IS NOT NULL;
DROP INDEX outbox_org_state_id;
CREATE INDEX outbox_org_state_id ON outbox (org, state, id) WHERE state <> 'claimed';

-- 0019_route_lead_plain.sql
-- rotation_pick_plain and route_lead (above, as they now read): catch-up's latest owners
-- read by a loop of their own (the member read was re-planned on every call once
-- `assignments` grew), the plain rotation's pick in SQL, the members bumped by primary key.

-- 0020_route_plain.sql
-- A PLAIN team's new lead (no caps, no catch-up, nobody blocked by the config at the call's
-- now: connector/routing/single.py plain_call) is decided and recorded by ONE statement,
-- with route_lead's records: route_lead runs six statements, each with its own executor
-- start and finish, and reads the members with a fresh snapshot after the lock; this one
-- statement reads them through row locks instead, and picks with rotation_pick_plain
-- (migration 0019; inlined by the planner). The statement sits in a function so that
-- the client sends a short call (the driver re-parses a statement text over 4 KB on every
-- call) and so that its writes can be undone when it must not decide (below).
--
-- Why one statement is correct: at READ COMMITTED its snapshot is taken before it waits for
-- the team lock, and what it reads of the rotation it reads through row locks, which re-read
-- a row updated since the snapshot at its newest version: the team row (FOR UPDATE) and the
-- team's members (FOR SHARE; a rotation's counts move only under the team lock, so they are
-- the previous lock holder's). Not FOR KEY SHARE: that lock takes a row whose update left
-- its key alone as the snapshot saw it, stale counts and all (bench.assign at 16 workers
-- gave a spread of 2 with it). Whoever changes a member without the team lock must take the
-- team lock first (connector rep deactivate does), or the two could deadlock. A member the
-- snapshot cannot see at all (a config apply added it while the lead waited) is caught by
-- the team row's version: an apply (and `connector rep away`) always writes the team row.
-- When the team row changed since the snapshot, or the team has no active member (route_lead
-- records that lead as unassigned), the statement's writes are undone (an exception block:
-- a subtransaction, rolled back, its locks with it; no measurable time per call, but a call
-- that writes uses a second transaction id) and the call answers status 'route_lead', as it does
-- when the statement wrote nothing (a repeat, a rep of the team away by command at p_now, a
-- team not in the database). The caller then calls route_lead, whose statements take fresh
-- snapshots: in the same transaction, or in autocommit as a statement of its own.
-- Otherwise status 'assigned' and the columns route_lead returns.
-- 0021_route_plain_one_pass.sql, 0022_decision_columns.sql,
-- 0023_route_plain_one_sort.sql
-- route_plain as it now reads: two statements in the one call, the second with a fresh
-- snapshot taken under the team's lock (no row lock on the members, no team version to
-- compare, no exception block); one sorted pass over the seats gives the rotation's totals
-- and the decision's arrays (0023), and the pick is one ordered read of the active seats
-- (rotation_pick_plain's ordering, which route_lead still uses). A lead it hands on is
-- deleted (under the lock, unless the team was retired while it waited), whose check of
-- leads.merged_into reads leads_merged_into. Its decision is the caller's p_detail plus the pick's part in columns
-- of routing_decisions (0022: no JSON built under the team's lock; read them through
-- decision_details).
CREATE FUNCTION route_plain(
    p_org text, p_crm_object text, p_source text, p_crm_id text, p_fields jsonb,
    p_parent_id text, p_team text, p_rule_index integer, p_rule_name text,
    p_now timestamptz, p_day date, p_week date, p_detail jsonb, p_sla_minutes integer
)
RETURNS TABLE (
    status text, lead_id bigint, team text, owner_id text, owner_name text, reason text,
    cand_ids bigint[], cand_skips text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    l record;
    r record;
    -- the decision as it will be stored when this call decides: the caller's part (the rules,
    -- the values, the instant), with the team, the outcome and the SLA; built here, before
    -- the team's lock is taken (the pick's part goes in columns, see below)
    v_detail jsonb := p_detail
        || jsonb_build_object('team', p_team, 'outcome', 'assigned')
        || CASE WHEN p_sla_minutes IS NULL THEN CAST('{}' AS jsonb)
                ELSE jsonb_build_object('sla_minutes', p_sla_minutes) END;
BEGIN
    team := p_team;
    status := 'route_lead';
    WITH snap AS (
        SELECT t.id FROM teams t
        WHERE t.org = p_org AND t.name = p_team AND t.in_config
          -- an active member (route_lead records a lead of a team without one unassigned)
          AND EXISTS (SELECT FROM members am
                      WHERE am.team_id = t.id AND am.active AND am.in_config)
          -- no rep of the team away by command at p_now (read from the org's time off,
          -- which is usually empty, not from the team's members)
          AND NOT EXISTS (
              SELECT FROM rep_time_off o
              WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until
                AND EXISTS (SELECT FROM members mb
                            WHERE mb.team_id = t.id AND mb.crm_user_id = o.crm_user_id
                              AND mb.in_config))
    ), lead AS (
        INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
        SELECT p_org, p_crm_object, p_crm_id, p_fields, p_parent_id, p_source FROM snap
        ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING
        RETURNING id, received_at
    ), locked AS (
        -- in_config is checked again on the row's newest version: a team a config apply
        -- retired while the lead waited is not locked
        SELECT t.id, t.epoch FROM teams t
        WHERE t.id = (SELECT snap.id FROM snap) AND t.in_config AND EXISTS (SELECT FROM lead)
        FOR UPDATE
    )
    SELECT lead.id, lead.received_at, locked.id AS team_id, locked.epoch
    FROM lead LEFT JOIN locked ON true
    INTO l;
    IF l.id IS NULL THEN  -- nothing written (a repeat, or no such team)
        RETURN NEXT;
        RETURN;
    END IF;
    IF l.team_id IS NULL THEN  -- the team was retired while the lead waited (not locked)
        DELETE FROM leads WHERE id = l.id;
        RETURN NEXT;
        RETURN;
    END IF;
    -- A new statement: a fresh snapshot, taken with the team's lock held.
    WITH seat AS (
        SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch AS turns, m.position,
               m.active, m.crm_user_id, m.name
        FROM members m
        WHERE m.team_id = l.team_id AND m.in_config
    ), seats AS (
        -- the rotation's totals over the active seats, and every member as the decision
        -- records it: the active seats in rotation order, then the inactive ones. One sort
        -- feeds the four arrays: they read the rows of a sorted subquery, with nothing at
        -- this level (no join, no grouping) to reorder them, as PostgreSQL's manual says
        -- "will usually work" (non-standard SQL; a subquery with ORDER BY is never pulled
        -- up, and the sort ends on the id, so it is total); four array_agg(... ORDER BY ...)
        -- would sort four times before PostgreSQL 16. test_route_lead checks the order.
        SELECT CAST(sum(o.weight) FILTER (WHERE o.active) AS bigint) AS w,
               CAST(sum(o.turns) FILTER (WHERE o.active) AS bigint) AS slot,
               array_agg(o.id) AS ids, array_agg(o.skip) AS skips,
               array_agg(o.weight) AS weights, array_agg(o.turns) AS turns
        FROM (SELECT s.id, s.weight, s.turns, s.active,
                     CASE WHEN NOT s.active THEN 'inactive' END AS skip
              FROM seat s
              ORDER BY NOT s.active, CASE WHEN s.active THEN -s.weight END, s.position,
                       s.id) o
    ), chosen AS (
        SELECT s.id, s.crm_user_id, s.name
        FROM seat s, seats
        WHERE s.active
          -- a rep of the team away by command now (read under the lock, so time off stored
          -- while the lead waited counts): route_lead decides the lead
          AND NOT EXISTS (
              SELECT FROM rep_time_off o JOIN seat mb ON mb.crm_user_id = o.crm_user_id
              WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until)
        ORDER BY s.turns * seats.w / s.weight > seats.slot,
                 ((s.turns + 1) * seats.w + s.weight - 1) / s.weight,
                 s.weight DESC, s.position, s.id
        LIMIT 1
    ), bump AS (
        UPDATE members mb SET assigned_in_epoch = mb.assigned_in_epoch + 1
        FROM chosen WHERE mb.id = chosen.id
        RETURNING mb.id
    ), load AS (
        INSERT INTO member_load (member_id, period, starts_on, assigned)
        SELECT chosen.id, k.period, k.starts_on, 1
        FROM chosen
        CROSS JOIN (VALUES ('day', p_day), ('week', p_week)) AS k (period, starts_on)
        ON CONFLICT (member_id, period, starts_on)
        DO UPDATE SET assigned = member_load.assigned + 1
        RETURNING member_id
    ), assigned AS (
        INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at)
        SELECT l.id, p_org, l.team_id, chosen.id, chosen.crm_user_id, l.epoch,
               p_rule_index, p_rule_name, p_source,
               now() + make_interval(mins => p_sla_minutes)
        FROM chosen
        RETURNING id
    ), queued AS (
        INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                            lead_received_at)
        SELECT p_org, l.id, assigned.id, p_crm_object, p_crm_id, chosen.crm_user_id,
               p_parent_id, l.received_at
        FROM assigned, chosen
        RETURNING id
    ), decided AS (
        -- the decision built before the lock (v_detail), and what the pick adds in columns
        -- of their own: no JSON is built while the team's lock is held (decision_details
        -- shows the row as one detail)
        INSERT INTO routing_decisions (org, lead_id, kind, detail, batch, epoch, chosen_id,
                                       seat_ids, seat_weights, seat_counts, seat_skips)
        SELECT p_org, l.id, 'route', v_detail, l.id, l.epoch, chosen.id,
               seats.ids, seats.weights, seats.turns, seats.skips
        FROM chosen, seats
        RETURNING lead_id
    )
    SELECT chosen.crm_user_id AS owner_id, chosen.name AS owner_name, seats.ids, seats.skips,
           (SELECT count(*) FROM decided) AS decided
    FROM chosen, seats
    INTO r;
    IF r.decided IS DISTINCT FROM 1 THEN
        -- nothing but the lead was written (a rep of the team went away by command or it
        -- lost its last active member while the lead waited): take the lead back,
        -- route_lead decides it
        DELETE FROM leads WHERE id = l.id;
        RETURN NEXT;
        RETURN;
    END IF;
    status := 'assigned';
    lead_id := l.id;
    owner_id := r.owner_id;
    owner_name := r.owner_name;
    cand_ids := r.ids;
    cand_skips := r.skips;
    RETURN NEXT;
END
$$;

-- The check a delete of a lead makes for leads merged into it (see above).
CREATE INDEX leads_merged_into ON leads (merged_into) WHERE merged_into IS NOT NULL;

-- 0024_lock_team_seats.sql
-- team_seats: team_candidates' query (db/routing.sql) as a STABLE SQL function the planner
-- inlines. lock_team_seats: a batch's team lock and the team's seats in one call; the second
-- statement's snapshot is taken under the lock. No row: no such team; one row with the
-- member columns NULL: no configured member.
CREATE FUNCTION team_seats(p_org text, p_team_id bigint, p_day date, p_week date)
RETURNS TABLE (
    id bigint, weight integer, turns bigint, "position" integer, crm_user_id text, name text,
    active boolean, away_from timestamptz, away_until timestamptz, day_count integer,
    week_count integer
)
LANGUAGE sql STABLE
AS $$
    SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch, m.position,
           m.crm_user_id, m.name, m.active, o.starts_at, o.until,
           coalesce(d.assigned, 0), coalesce(w.assigned, 0)
    FROM members m
    LEFT JOIN rep_time_off o ON o.org = p_org AND o.crm_user_id = m.crm_user_id
    LEFT JOIN member_load d ON d.member_id = m.id AND d.period = 'day' AND d.starts_on = p_day
    LEFT JOIN member_load w
           ON w.member_id = m.id AND w.period = 'week' AND w.starts_on = p_week
    WHERE m.team_id = p_team_id AND m.in_config
$$;

CREATE FUNCTION lock_team_seats(p_org text, p_team text, p_day date, p_week date)
RETURNS TABLE (
    team_id bigint, epoch integer, id bigint, weight integer, turns bigint, "position" integer,
    crm_user_id text, name text, active boolean, away_from timestamptz, away_until timestamptz,
    day_count integer, week_count integer
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    t record;
BEGIN
    SELECT tm.id, tm.epoch FROM teams tm
    WHERE tm.org = p_org AND tm.name = p_team AND tm.in_config
    FOR UPDATE
    INTO t;
    IF t.id IS NULL THEN  -- no such team in the database: no row
        RETURN;
    END IF;
    -- A new statement: a fresh snapshot, taken with the team's lock held.
    RETURN QUERY
    SELECT t.id, t.epoch, s.id, s.weight, s.turns, s.position, s.crm_user_id, s.name, s.active,
           s.away_from, s.away_until, s.day_count, s.week_count
    FROM team_seats(p_org, t.id, p_day, p_week) s
    ORDER BY s.position;
    IF NOT FOUND THEN  -- no configured member: the lock's row alone
        team_id := t.id;
        epoch := t.epoch;
        RETURN NEXT;
    END IF;
END
$$;

-- 0025_route_plain_batch.sql
-- route_plain_batch: a batch's leads of one plain team of equal weights, locked, picked and
-- recorded in one call (as record_assignments records them); status 'general' when it left
-- them to the general path, having written nothing.
CREATE FUNCTION route_plain_batch(
    p_org text, p_crm_object text, p_source text, p_team text, p_now timestamptz,
    p_day date, p_week date, p_batch bigint, p_lead_ids bigint[], p_crm_ids text[],
    p_parent_ids text[], p_rule_indexes integer[], p_rule_names text[],
    p_sla_minutes integer[], p_detail_of integer[], p_details jsonb
)
RETURNS TABLE (
    status text, epoch integer, member_ids bigint[], seat_ids bigint[], seat_skips text[],
    seat_users text[], seat_names text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    t record;
    r record;
    v_n integer := cardinality(p_lead_ids);
BEGIN
    status := 'general';
    IF v_n IS NULL OR v_n = 0 THEN  -- no lead: nothing to decide
        RETURN NEXT;
        RETURN;
    END IF;
    -- The checks are made first with the snapshot from before the lock, so that this call
    -- does not wait for the lock of a team it will not decide (a rep away by command for
    -- days, say), which the general path then waits for; they are made again under the lock.
    SELECT tm.id, tm.epoch FROM teams tm
    WHERE tm.org = p_org AND tm.name = p_team AND tm.in_config
      AND (SELECT count(*) > 0 AND min(am.weight) = max(am.weight) FROM members am
           WHERE am.team_id = tm.id AND am.active AND am.in_config)
      AND NOT EXISTS (
          SELECT FROM rep_time_off o JOIN members mb ON mb.crm_user_id = o.crm_user_id
          WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until
            AND mb.team_id = tm.id AND mb.in_config)
    FOR UPDATE
    INTO t;
    IF t.id IS NULL THEN
        -- not locked: no such team (the general path says so), or one this call does not
        -- decide
        RETURN NEXT;
        RETURN;
    END IF;
    epoch := t.epoch;
    -- A new statement: a fresh snapshot, taken with the team's lock held.
    WITH seat AS (
        SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch AS turns, m.position,
               m.active, m.crm_user_id, m.name
        FROM members m
        WHERE m.team_id = t.id AND m.in_config
    ), ok AS (
        -- one row when this call decides the batch: an active member, equal weights, nobody
        -- of the team away by command at p_now
        SELECT CAST(count(*) AS integer) AS k, max(s.turns) AS top
        FROM seat s
        WHERE s.active
        HAVING count(*) > 0 AND min(s.weight) = max(s.weight)
           AND NOT EXISTS (
               SELECT FROM rep_time_off o JOIN seat mb ON mb.crm_user_id = o.crm_user_id
               WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until)
    ), seats AS (
        -- every member as the decisions record it: the active seats in rank order, then the
        -- inactive ones; one sort feeds the arrays (as in route_plain, migration 0023)
        SELECT array_agg(o.id) AS ids, array_agg(o.skip) AS skips, array_agg(o.weight) AS weights,
               array_agg(o.turns) AS turns, array_agg(o.crm_user_id) AS users,
               array_agg(o.name) AS names, count(*) AS len
        FROM (SELECT s.id, s.weight, s.turns, s.crm_user_id, s.name,
                     CASE WHEN NOT s.active THEN 'inactive' END AS skip
              FROM seat s
              ORDER BY NOT s.active, s.position, s.id) o
    ), ranked AS (
        SELECT s.id, s.turns, s.crm_user_id,
               CAST(row_number() OVER (ORDER BY s.position, s.id) AS integer) AS rk
        FROM seat s
        WHERE s.active
    ), turn AS (
        -- each active seat's next turns, far enough for v_n picks: from level top on, every
        -- level gives k picks, and no seat takes more than v_n
        SELECT a.id, a.crm_user_id, a.rk, g.t
        FROM ok, ranked a,
             generate_series(a.turns, least(a.turns + v_n, ok.top + (v_n + ok.k - 1) / ok.k) - 1)
                 AS g (t)
    ), pick AS (
        SELECT u.id AS member_id, u.crm_user_id, u.rk, u.t,
               row_number() OVER (ORDER BY u.t, u.rk) AS ord
        FROM turn u
        ORDER BY u.t, u.rk
        LIMIT v_n
    ), picks AS (
        SELECT p.*, k.member_id, k.crm_user_id, k.rk, k.t
        FROM ROWS FROM (unnest(p_lead_ids), unnest(p_crm_ids), unnest(p_parent_ids),
                        unnest(p_rule_indexes), unnest(p_rule_names), unnest(p_sla_minutes),
                        unnest(p_detail_of))
             WITH ORDINALITY AS p (lead_id, crm_id, parent_id, rule_index, rule_name,
                                   sla_minutes, detail_of, ord)
        JOIN pick k ON k.ord = p.ord
    ), per_member AS (
        SELECT member_id, count(*) AS n FROM picks GROUP BY member_id
    ), bump AS (
        UPDATE members m SET assigned_in_epoch = m.assigned_in_epoch + pm.n
        FROM per_member pm WHERE m.id = pm.member_id
        RETURNING m.id
    ), load AS (
        INSERT INTO member_load (member_id, period, starts_on, assigned)
        SELECT pm.member_id, k.period, k.starts_on, pm.n
        FROM per_member pm
        CROSS JOIN (VALUES ('day', p_day), ('week', p_week)) AS k (period, starts_on)
        ON CONFLICT (member_id, period, starts_on)
        DO UPDATE SET assigned = member_load.assigned + EXCLUDED.assigned
        RETURNING member_id
    ), assigned AS (
        -- assignment ids follow the picks' order (connector simulate replays by them)
        INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at)
        SELECT p.lead_id, p_org, t.id, p.member_id, p.crm_user_id, t.epoch, p.rule_index,
               p.rule_name, p_source, now() + make_interval(mins => p.sla_minutes)
        FROM picks p
        ORDER BY p.ord
        RETURNING id, lead_id, crm_user_id
    ), decided AS (
        INSERT INTO routing_decisions (org, lead_id, kind, detail, batch, epoch, chosen_id,
                                       seat_ids, seat_weights, seat_counts, seat_skips)
        SELECT p_org, p.lead_id, 'route', p_details -> p.detail_of, p_batch, t.epoch,
               p.member_id, x.ids, x.weights,
               CASE WHEN p.t >= ok.top
                    -- every seat has reached level t: the seats before the pick's have had
                    -- their turn at it, the others not yet (then the inactive seats)
                    THEN array_fill(p.t + 1, ARRAY[p.rk - 1]) || array_fill(p.t, ARRAY[ok.k - p.rk + 1])
                         || x.turns[ok.k + 1:]
                    ELSE ARRAY(SELECT CASE WHEN i <= ok.k
                                           THEN greatest(x.turns[i],
                                                         p.t + CASE WHEN i < p.rk THEN 1 ELSE 0 END)
                                           ELSE x.turns[i] END
                               FROM generate_series(1, CAST(x.len AS integer)) AS i)
               END,
               x.skips
        FROM picks p CROSS JOIN seats x CROSS JOIN ok
        WHERE p_details -> p.detail_of IS NOT NULL
        RETURNING lead_id
    ), queued AS (
        -- every lead picked here was inserted by the caller's transaction, whose now() its
        -- received_at defaulted to (as record_assignments)
        INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id,
                            parent_id, lead_received_at)
        SELECT p_org, a.lead_id, a.id, p_crm_object, p.crm_id, a.crm_user_id, p.parent_id,
               now()
        FROM assigned a JOIN picks p ON p.lead_id = a.lead_id
        RETURNING lead_id
    )
    SELECT (SELECT array_agg(p.member_id ORDER BY p.ord) FROM picks p) AS member_ids,
           x.ids, x.skips, x.users, x.names,
           (SELECT count(*) FROM queued) AS queued, (SELECT count(*) FROM decided) AS decided
    FROM seats x
    INTO r;
    IF r.queued = 0 AND r.decided = 0 THEN
        -- not decided here (ok had no row, so nothing was written): the general path
        RETURN NEXT;
        RETURN;
    END IF;
    IF r.queued <> v_n THEN  -- cannot happen: every lead is picked or none is
        RAISE EXCEPTION 'route_plain_batch picked some of the leads, not all';
    END IF;
    status := 'assigned';
    member_ids := r.member_ids;
    seat_ids := r.ids;
    seat_skips := r.skips;
    seat_users := r.users;
    seat_names := r.names;
    RETURN NEXT;
END
$$;

-- 0026_member_keys.sql
-- The members' ids in a table that is never updated, for assignments' foreign key to check
-- against: a members row is updated by every batch that picks its rep, and behind a held
-- snapshot the key's check per assigned lead walked all of its versions. The migration says
-- more.
CREATE TABLE member_keys (
    id bigint PRIMARY KEY REFERENCES members (id) ON DELETE CASCADE ON UPDATE CASCADE
);

CREATE FUNCTION members_add_key() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO member_keys (id) VALUES (NEW.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER members_add_key
AFTER INSERT ON members
FOR EACH ROW EXECUTE FUNCTION members_add_key();

-- 0027_validate_member_keys.sql validates it (0026 adds it NOT VALID, so that it scans
-- nothing under its exclusive locks)
ALTER TABLE assignments
    ADD CONSTRAINT assignments_member_id_fkey FOREIGN KEY (member_id) REFERENCES member_keys (id);

-- 0028_one_router.sql
-- One router: every rotation pick is made by rotation_picks and every assignment is recorded
-- by record_assignments (both below), for one lead (route_lead) or a team's batch
-- (route_team). The special-case forms they replace are dropped.
DROP FUNCTION IF EXISTS route_plain(text, text, text, text, jsonb, text, text, integer, text,
                                    timestamptz, date, date, jsonb, integer);
DROP FUNCTION IF EXISTS route_plain_batch(text, text, text, text, timestamptz, date, date, bigint,
                                          bigint[], text[], text[], integer[], text[],
                                          integer[], integer[], jsonb);
DROP FUNCTION IF EXISTS route_lead(text, text, text, text, jsonb, text, text, integer, text,
                                   timestamptz, date, date, text[], text[], integer[],
                                   integer[], integer, integer, integer, jsonb, integer);
DROP FUNCTION IF EXISTS rotation_pick_plain(bigint[], integer[], bigint[], integer[]);
DROP FUNCTION IF EXISTS rotation_pick(bigint[], integer[], bigint[], integer[], text[],
                                      integer[], integer, bigint[]);
DROP FUNCTION IF EXISTS lock_team_seats(text, text, date, date);

-- The weighted rotation for the next p_count leads of a team: the production form of
-- connector/routing/rotation.py pick_available (the executable specification, which
-- `connector simulate` replays with; tests/test_router_sql.py holds the two together, pick
-- for pick). It runs on the server so that a lead is decided in the one round trip that
-- holds the team's lock: done in the client, the lock would also be held across the round
-- trip that brings the seats back.
-- Seats 1..p_active are the rotation's, in its order (heavier first, then position, then
-- id); seats after them are inactive members, listed only for the decisions. blocked:
-- 'away', 'off_shift' or 'inactive' (NULL: may take a lead); room: leads its caps still allow
-- (NULL: no cap); max_in_a_row: K of catch_up (NULL: catch_up none); recent: the team's
-- latest owners, newest first. Returns each lead's pick (NULL: nobody could take it) and,
-- per lead, every seat's skip reason and its count at that pick (flat: seat i of lead j at
-- (j - 1) * cardinality(ids) + i; counts advance by picks, as a decision records them), and
-- the turns credited to the seats passed over.
CREATE FUNCTION rotation_picks(
    ids bigint[], weights integer[], turns bigint[], blocked text[], room integer[],
    p_active integer, max_in_a_row integer, recent bigint[], p_count integer,
    OUT picks bigint[], OUT skips text[], OUT counts bigint[],
    OUT credit_ids bigint[], OUT credit_ns bigint[]
)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    k      integer := coalesce(p_active, 0);
    t      bigint[] := turns;   -- rotation turns: leads and credited turns
    shown  bigint[] := turns;   -- what a decision records: advanced by picks only
    lft    integer[] := room;
    why    text[] := blocked;
    cred   boolean[];
    gave   bigint[];
    hist   bigint[] := '{}';
    total  bigint := 0;
    slot   bigint := 0;
    able   integer := 0;
    excl   integer;
    best   integer;
    dl     bigint;
    best_dl bigint;
    i      integer;
    j      integer;
BEGIN
    picks := '{}'; skips := '{}'; counts := '{}'; credit_ids := '{}'; credit_ns := '{}';
    IF p_count IS NULL OR p_count <= 0 THEN
        RETURN;
    END IF;
    cred := array_fill(false, ARRAY[greatest(k, 1)]);
    gave := array_fill(0::bigint, ARRAY[greatest(k, 1)]);
    IF max_in_a_row IS NOT NULL THEN
        hist := coalesce(recent[1:max_in_a_row], '{}');
    END IF;
    FOR i IN 1..k LOOP
        total := total + weights[i];
        slot := slot + t[i];
        IF why[i] IS NULL AND lft[i] = 0 THEN
            why[i] := 'capped';
        END IF;
        -- passed over with a credit: capped, off shift, and away unless the team catches up
        cred[i] := coalesce(why[i] IN ('capped', 'off_shift')
                            OR (why[i] = 'away' AND max_in_a_row IS NULL), false);
        IF why[i] IS NULL THEN
            able := able + 1;
        END IF;
    END LOOP;
    FOR j IN 1..p_count LOOP
        skips := skips || why;
        counts := counts || shown;
        IF able = 0 THEN
            picks := picks || NULL::bigint;
            CONTINUE;
        END IF;
        -- catch-up: no (K+1)-th lead in a row while another rep can take it, unless that rep
        -- is already ahead of its share, or its share is more than K of every K+1 leads
        excl := NULL;
        IF max_in_a_row IS NOT NULL AND able > 1 AND cardinality(hist) >= max_in_a_row
           AND hist[1:max_in_a_row] <@ ARRAY[hist[1]] THEN
            excl := array_position(ids[1:k], hist[1]);
            IF excl IS NOT NULL
               AND NOT (why[excl] IS NULL AND slot * weights[excl] >= t[excl] * total
                        AND max_in_a_row * total >= (max_in_a_row + 1) * weights[excl]) THEN
                excl := NULL;
            END IF;
        END IF;
        LOOP
            best := NULL;
            FOR i IN 1..k LOOP
                CONTINUE WHEN i = excl OR NOT (why[i] IS NULL OR cred[i])
                              OR t[i] * total / weights[i] > slot;
                dl := ((t[i] + 1) * total + weights[i] - 1) / weights[i];
                IF best IS NULL OR dl < best_dl THEN
                    best := i;
                    best_dl := dl;
                END IF;
            END LOOP;
            IF best IS NOT NULL THEN
                IF why[best] IS NOT NULL THEN  -- its turn is credited; the schedule moves on
                    t[best] := t[best] + 1;
                    gave[best] := gave[best] + 1;
                    slot := slot + 1;
                    CONTINUE;
                END IF;
            ELSE  -- the away reps' share is not consumed: serve the earliest deadline
                FOR i IN 1..k LOOP
                    CONTINUE WHEN i = excl OR why[i] IS NOT NULL;
                    dl := ((t[i] + 1) * total + weights[i] - 1) / weights[i];
                    IF best IS NULL OR dl < best_dl THEN
                        best := i;
                        best_dl := dl;
                    END IF;
                END LOOP;
            END IF;
            EXIT;
        END LOOP;
        t[best] := t[best] + 1;
        shown[best] := shown[best] + 1;
        slot := slot + 1;
        IF lft[best] IS NOT NULL THEN
            lft[best] := lft[best] - 1;
            IF lft[best] = 0 THEN
                why[best] := 'capped';
                cred[best] := true;
                able := able - 1;
            END IF;
        END IF;
        IF max_in_a_row IS NOT NULL THEN
            hist := (ids[best] || hist)[1:max_in_a_row];
        END IF;
        picks := picks || ids[best];
    END LOOP;
    FOR i IN 1..k LOOP
        IF gave[i] > 0 THEN
            credit_ids := credit_ids || ids[i];
            credit_ns := credit_ns || gave[i];
        END IF;
    END LOOP;
END
$$;

-- THE RECORDER: every assignment is inserted here, with what goes with it in the same
-- statement: the members' rotation counts and credits and the caps' counters (p_turns: a
-- rotation's picks; an account owner's lead is no turn), one outbox row per assignment, and
-- the leads' decisions. Leads in pick order; a lead whose member is NULL was placed by nobody:
-- with p_reason it is recorded unassigned (its reason and decision), else nothing is written
-- for it. Assignment ids follow the picks' order, so ordering a team's assignments by id
-- replays its rotation (`connector simulate`). The decisions: p_details is one JSON array of
-- distinct decisions and p_detail_of each lead's position in it, 0-based (NULL: the lead's
-- decision is written by the caller); a pick's part (batch, epoch, chosen member and seats:
-- p_seat_ids and p_seat_weights for every lead, p_seat_skips and p_seat_counts flat, one run
-- of the seats' length per lead) goes in columns, read back through decision_details. Every
-- lead given here was inserted by this transaction, so now() is its received_at.
CREATE FUNCTION record_assignments(
    p_org text, p_crm_object text, p_source text, p_team_id bigint, p_epoch integer,
    p_turns boolean, p_day date, p_week date,
    p_lead_ids bigint[], p_member_ids bigint[], p_crm_ids text[], p_parent_ids text[],
    p_rule_indexes integer[], p_rule_names text[], p_sla_minutes integer[],
    p_account_matches jsonb, p_credit_ids bigint[], p_credit_ns bigint[],
    p_batch bigint, p_details jsonb, p_detail_of integer[],
    p_seat_ids bigint[], p_seat_weights integer[], p_seat_skips text[], p_seat_counts bigint[],
    p_reason text
)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    k integer := coalesce(cardinality(p_seat_ids), 0);
BEGIN
    WITH picks AS (
        SELECT *
        FROM unnest(p_lead_ids, p_member_ids, p_rule_indexes, p_rule_names, p_crm_ids,
                    p_parent_ids, p_sla_minutes, p_detail_of)
             WITH ORDINALITY AS p (lead_id, member_id, rule_index, rule_name, crm_id, parent_id,
                                   sla_minutes, detail_of, ord)
    ), per_member AS (
        SELECT p.member_id, count(*) AS n FROM picks p
        WHERE p_turns AND p.member_id IS NOT NULL
        GROUP BY p.member_id
    ), credits AS (
        SELECT * FROM unnest(p_credit_ids, p_credit_ns) AS c (member_id, n)
    ), bump AS (
        -- one UPDATE per member row: a member may be picked and credited in the same batch
        UPDATE members m
        SET assigned_in_epoch = m.assigned_in_epoch + coalesce(pm.n, 0),
            credited_in_epoch = m.credited_in_epoch + coalesce(c.n, 0)
        FROM per_member pm FULL JOIN credits c ON c.member_id = pm.member_id
        WHERE m.id = coalesce(pm.member_id, c.member_id)
        RETURNING m.id
    ), load AS (
        -- the caps' counters: this day and this week in the team's time zone
        INSERT INTO member_load (member_id, period, starts_on, assigned)
        SELECT pm.member_id, w.period, w.starts_on, pm.n
        FROM per_member pm
        CROSS JOIN (VALUES ('day', p_day), ('week', p_week)) AS w (period, starts_on)
        ON CONFLICT (member_id, period, starts_on)
        DO UPDATE SET assigned = member_load.assigned + EXCLUDED.assigned
        RETURNING member_id
    ), assigned AS (
        INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at, account_match)
        SELECT p.lead_id, p_org, p_team_id, p.member_id, m.crm_user_id, p_epoch,
               p.rule_index, p.rule_name, p_source,
               now() + make_interval(mins => p.sla_minutes),
               p_account_matches -> CAST(p.ord - 1 AS integer)
        FROM picks p JOIN members m ON m.id = p.member_id
        ORDER BY p.ord
        RETURNING id, lead_id, crm_user_id
    ), unplaced AS (
        UPDATE leads l SET unassigned_reason = p_reason
        FROM picks p
        WHERE p_reason IS NOT NULL AND p.member_id IS NULL AND l.id = p.lead_id
        RETURNING l.id
    ), decided AS (
        -- in pick order, unsorted: readers order a lead's decisions by id
        INSERT INTO routing_decisions (org, lead_id, kind, detail, batch, epoch, chosen_id,
                                       seat_ids, seat_weights, seat_counts, seat_skips)
        SELECT p_org, p.lead_id, 'route',
               CASE WHEN p.member_id IS NOT NULL THEN p_details -> p.detail_of
                    ELSE (p_details -> p.detail_of) - 'sla_minutes'
                         || jsonb_build_object('outcome', 'unassigned', 'reason', p_reason)
               END,
               p_batch, CASE WHEN p.member_id IS NOT NULL THEN p_epoch END, p.member_id,
               p_seat_ids, p_seat_weights,
               p_seat_counts[(p.ord - 1) * k + 1:p.ord * k],
               p_seat_skips[(p.ord - 1) * k + 1:p.ord * k]
        FROM picks p
        WHERE p_details -> p.detail_of IS NOT NULL
          AND (p.member_id IS NOT NULL OR p_reason IS NOT NULL)
        RETURNING lead_id
    )
    INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                        lead_received_at)
    SELECT p_org, a.lead_id, a.id, p_crm_object, p.crm_id, a.crm_user_id, p.parent_id, now()
    FROM assigned a JOIN picks p ON p.lead_id = a.lead_id;
END
$$;

-- THE ROUTER: a team's leads (1..N, stored by this transaction, in the order they get their
-- turns) decided and recorded in one call: the team row is locked (the lock that serialises
-- the team's rotation in every process), the members read with a snapshot taken under that
-- lock (each statement of a VOLATILE function takes a fresh one), the picks made by
-- rotation_picks and recorded by record_assignments. What only the config knows comes in:
-- each configured member's block at p_now (p_users / p_blocked: 'away' by YAML time off,
-- 'off_shift', or NULL), its caps (a member the config does not name has the team's), K of
-- catch-up. Time off set by `connector rep away` is read here. Leads nobody can take are
-- recorded unassigned when p_final, else returned unwritten (they go on to the overflow
-- team). Status 'no_team' (nothing written): the team is not in the database.
CREATE FUNCTION route_team(
    p_org text, p_crm_object text, p_source text, p_team text,
    p_now timestamptz, p_day date, p_week date, p_batch bigint,
    p_users text[], p_blocked text[], p_per_day integer[], p_per_week integer[],
    p_team_per_day integer, p_team_per_week integer, p_max_in_a_row integer,
    p_lead_ids bigint[], p_crm_ids text[], p_parent_ids text[], p_rule_indexes integer[],
    p_rule_names text[], p_sla_minutes integer[], p_details jsonb, p_detail_of integer[],
    p_final boolean
)
RETURNS TABLE (
    status text, epoch integer, member_ids bigint[], reason text, seat_ids bigint[],
    seat_users text[], seat_names text[], seat_weights integer[], seat_skips text[],
    seat_counts bigint[], away_by_command text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_team   bigint;
    v_recent bigint[] := '{}';
    v_member bigint;
    s        record;
    r        record;
    v_n      integer := coalesce(cardinality(p_lead_ids), 0);
    v_k      integer;
    v_first  integer;
    v_skips  text[];
    v_details jsonb := p_details;
BEGIN
    SELECT t.id, t.epoch INTO v_team, epoch
    FROM teams t WHERE t.org = p_org AND t.name = p_team AND t.in_config FOR UPDATE;
    IF NOT FOUND THEN
        status := 'no_team';
        RETURN NEXT;
        RETURN;
    END IF;
    -- catch-up's latest owners, newest first, read under the lock. The constant LIMIT is the
    -- largest K (config.py MAX_IN_A_ROW): a LIMIT given as a parameter is unknown to a
    -- generic plan, which the planner then costs by the size of `assignments` and re-plans
    -- on every call; with the constant it reads the team's index backwards, and the loop
    -- stops after K.
    IF p_max_in_a_row IS NOT NULL THEN
        FOR v_member IN
            SELECT a.member_id FROM assignments a WHERE a.team_id = v_team
            ORDER BY a.id DESC LIMIT 1000
        LOOP
            v_recent := v_recent || v_member;
            EXIT WHEN cardinality(v_recent) >= p_max_in_a_row;
        END LOOP;
    END IF;
    -- The members, in a new statement: a fresh snapshot, so the counts the previous lock
    -- holder committed. The rotation's seats first, in its order, then the inactive ones.
    SELECT array_agg(y.id ORDER BY y.rk) AS ids, array_agg(y.crm_user_id ORDER BY y.rk) AS users,
           array_agg(y.name ORDER BY y.rk) AS names, array_agg(y.weight ORDER BY y.rk) AS weights,
           array_agg(y.turns ORDER BY y.rk) AS turns, array_agg(y.why ORDER BY y.rk) AS why,
           array_agg(y.room ORDER BY y.rk) AS room,
           CAST(count(*) FILTER (WHERE y.active) AS integer) AS active,
           -- reps away by `connector rep away` now, sorted by code point (as Python sorts)
           coalesce(array_agg(y.crm_user_id ORDER BY y.crm_user_id COLLATE "C")
                    FILTER (WHERE y.away_cmd), '{}') AS away_cmd
    INTO s
    FROM (
        SELECT mb.id, mb.crm_user_id, mb.name, mb.weight, mb.active,
               -- the rotation's seats in its order, then the inactive members
               row_number() OVER (ORDER BY NOT mb.active,
                                  CASE WHEN mb.active THEN mb.weight END DESC, mb.position,
                                  mb.id) AS rk,
               mb.assigned_in_epoch + mb.credited_in_epoch AS turns,
               CASE WHEN NOT mb.active THEN 'inactive'
                    WHEN o.starts_at <= p_now AND p_now < o.until THEN 'away'
                    ELSE p_blocked[c.i] END AS why,
               coalesce(o.starts_at <= p_now AND p_now < o.until, false) AS away_cmd,
               CASE WHEN cap.day IS NOT NULL OR cap.week IS NOT NULL THEN
               greatest(0, least(cap.day - coalesce(d.assigned, 0),
                                 cap.week - coalesce(w.assigned, 0))) END AS room
        FROM members mb
        CROSS JOIN LATERAL (SELECT array_position(p_users, mb.crm_user_id) AS i) c
        -- a member the config does not name has the team's caps; NULL: no cap (least and
        -- greatest skip NULLs, so a NULL room is left only when neither is set)
        CROSS JOIN LATERAL (
            SELECT CASE WHEN c.i IS NULL THEN p_team_per_day ELSE p_per_day[c.i] END AS day,
                   CASE WHEN c.i IS NULL THEN p_team_per_week ELSE p_per_week[c.i] END AS week
        ) cap
        LEFT JOIN rep_time_off o ON o.org = p_org AND o.crm_user_id = mb.crm_user_id
        -- a count is read only for a cap that is set (the test gates the index probe)
        LEFT JOIN LATERAL (
            SELECT l.assigned FROM member_load l
            WHERE cap.day IS NOT NULL
              AND l.member_id = mb.id AND l.period = 'day' AND l.starts_on = p_day
        ) d ON true
        LEFT JOIN LATERAL (
            SELECT l.assigned FROM member_load l
            WHERE cap.week IS NOT NULL
              AND l.member_id = mb.id AND l.period = 'week' AND l.starts_on = p_week
        ) w ON true
        WHERE mb.team_id = v_team AND mb.in_config
    ) y;
    seat_ids := coalesce(s.ids, '{}');
    seat_users := coalesce(s.users, '{}');
    seat_names := coalesce(s.names, '{}');
    seat_weights := coalesce(s.weights, '{}');
    away_by_command := s.away_cmd;
    v_k := cardinality(seat_ids);
    SELECT * INTO r
    FROM rotation_picks(seat_ids, seat_weights, s.turns, s.why, s.room, s.active,
                        p_max_in_a_row, v_recent, v_n);
    member_ids := r.picks;
    seat_skips := r.skips;
    seat_counts := r.counts;
    v_first := array_position(r.picks, NULL);
    IF v_first IS NOT NULL THEN
        -- nobody can take this lead, nor (caps only fill) any after it
        v_skips := r.skips[(v_first - 1) * v_k + 1:v_first * v_k];
        reason := CASE
            WHEN s.active = 0 OR s.active IS NULL THEN 'no_active_member'
            WHEN 'capped' = ANY (v_skips[1:s.active]) THEN 'all_capped'
            ELSE 'none_available' END;
    END IF;
    IF cardinality(s.away_cmd) > 0 THEN
        -- with those a lead met in the teams it overflowed from, sorted by code point
        SELECT jsonb_agg(e || jsonb_build_object('away_by_command', (
                   SELECT to_jsonb(array_agg(x.u ORDER BY x.u COLLATE "C"))
                   FROM (SELECT jsonb_array_elements_text(coalesce(e -> 'away_by_command',
                                                                   '[]'))
                         UNION
                         SELECT unnest(s.away_cmd)) AS x (u))))
        INTO v_details FROM jsonb_array_elements(p_details) AS e;
    END IF;
    PERFORM record_assignments(
        p_org, p_crm_object, p_source, v_team, epoch, true, p_day, p_week,
        p_lead_ids, r.picks, p_crm_ids, p_parent_ids, p_rule_indexes, p_rule_names,
        p_sla_minutes, NULL, r.credit_ids, r.credit_ns, p_batch, v_details, p_detail_of,
        seat_ids, seat_weights, r.skips, r.counts, CASE WHEN p_final THEN reason END);
    status := 'routed';
    RETURN NEXT;
END
$$;

-- One new lead of a rotation rule in ONE call: stored under its unique key, then decided and
-- recorded by route_team (the team locked for this call plus the commit). A repeat gets its
-- stored outcome (status 'duplicate'), even when its team left the database; 'no_team' when
-- the team is not in the database (nothing written).
CREATE FUNCTION route_lead(
    p_org text, p_crm_object text, p_source text, p_crm_id text, p_fields jsonb,
    p_parent_id text, p_team text, p_rule_index integer, p_rule_name text,
    p_now timestamptz, p_day date, p_week date,
    p_users text[], p_blocked text[], p_per_day integer[], p_per_week integer[],
    p_team_per_day integer, p_team_per_week integer, p_max_in_a_row integer,
    p_detail jsonb, p_sla_minutes integer
)
RETURNS TABLE (
    status text, lead_id bigint, team text, owner_id text, owner_name text, reason text,
    member_ids bigint[], seat_ids bigint[], seat_users text[], seat_names text[],
    seat_skips text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_lead bigint;
    r      record;
BEGIN
    team := p_team;
    IF EXISTS (SELECT FROM teams t WHERE t.org = p_org AND t.name = p_team AND t.in_config) THEN
        INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
        VALUES (p_org, p_crm_object, p_crm_id, p_fields, p_parent_id, p_source)
        ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING
        RETURNING id INTO v_lead;
        IF v_lead IS NOT NULL THEN
            lead_id := v_lead;
            SELECT * INTO r
            FROM route_team(p_org, p_crm_object, p_source, p_team, p_now, p_day, p_week, v_lead,
                            p_users, p_blocked, p_per_day, p_per_week, p_team_per_day,
                            p_team_per_week, p_max_in_a_row, ARRAY[v_lead], ARRAY[p_crm_id],
                            ARRAY[p_parent_id], ARRAY[p_rule_index], ARRAY[p_rule_name],
                            ARRAY[p_sla_minutes], jsonb_build_array(p_detail), ARRAY[0], true);
            IF r.status = 'no_team' THEN  -- retired while the lead waited: nothing is kept
                DELETE FROM leads l WHERE l.id = v_lead;
                status := 'no_team';
                lead_id := NULL;
                RETURN NEXT;
                RETURN;
            END IF;
            status := 'routed';
            reason := r.reason;
            member_ids := r.member_ids;
            seat_ids := r.seat_ids;
            seat_users := r.seat_users;
            seat_names := r.seat_names;
            seat_skips := r.seat_skips;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    SELECT l.id, a.crm_user_id, t.name, mm.name,
           CASE WHEN a.crm_user_id IS NULL THEN l.unassigned_reason END
    INTO lead_id, owner_id, team, owner_name, reason
    FROM leads l
    LEFT JOIN assignments a ON a.lead_id = l.id
    LEFT JOIN teams t ON t.id = a.team_id
    LEFT JOIN members mm ON mm.id = a.member_id
    WHERE l.org = p_org AND l.crm_object = p_crm_object AND l.crm_id = p_crm_id
      AND l.merged_into IS NULL;
    status := CASE WHEN FOUND THEN 'duplicate' ELSE 'no_team' END;
    IF NOT FOUND THEN
        team := p_team;
    END IF;
    RETURN NEXT;
END
$$;
