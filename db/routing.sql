-- Named SQL for assignment. Statement order inside one transaction matters:
--   insert_leads (sorted by CRM id) -> lock_team (teams sorted by name, overflow teams
--   included) -> team_candidates [-> recent_owners] -> record_assignments (with the picks'
--   decisions) -> record_decisions (decisions.sql: the other leads' decisions) -> COMMIT.
--   lock_team_seats is lock_team and team_candidates in one call (db/functions/seats.sql).
--   A batch whose leads all go to one plain team takes route_plain_batch instead, after
--   insert_leads: the lock, the picks and the records in one call (db/functions/routing.sql).
-- A single lead of a rotation rule takes route_lead instead: all of it in one call.
-- team_candidates must be its own statement: under READ COMMITTED each statement takes a
-- fresh snapshot, so reading the seats AFTER lock_team returned sees the counts the previous
-- lock holder committed. Reading them in the locking statement would see stale counts
-- (route_lead does the same inside its function: a VOLATILE function's statements each take
-- a fresh snapshot).

-- name: insert_leads
-- :fields is ONE JSON array, zipped with the CRM ids by position (one json.dumps a batch).
-- Router._insert reads the returned columns by position: keep their order. Each new lead's
-- received_at is its default, now(): the transaction's start (record_assignments relies on
-- it, and does not need it sent back).
INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
SELECT :org, :crm_object, t.crm_id, t.fields, t.parent_id, :source
FROM ROWS FROM (unnest(CAST(:crm_ids AS text[])), jsonb_array_elements(CAST(:fields AS jsonb)),
                unnest(CAST(:parent_ids AS text[])))
     AS t (crm_id, fields, parent_id)
ORDER BY t.crm_id
ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING
RETURNING id, crm_id

-- name: existing_leads
-- A merged lead (merged_into set) is a second copy of a record; its winner answers for it.
SELECT l.crm_id, l.id, a.crm_user_id, t.name AS team, m.name AS owner_name,
       l.unassigned_reason
FROM leads l
LEFT JOIN assignments a ON a.lead_id = l.id
LEFT JOIN teams t ON t.id = a.team_id
LEFT JOIN members m ON m.id = a.member_id
WHERE l.org = :org AND l.crm_object = :crm_object AND l.crm_id = ANY(CAST(:crm_ids AS text[]))
  AND l.merged_into IS NULL

-- name: lock_team
SELECT id, epoch FROM teams WHERE org = :org AND name = :name AND in_config FOR UPDATE

-- name: team_candidates
-- Every configured member (inactive ones too, so a pick can say why each was skipped), its
-- rotation turns, its time off set from the command line, and its leads in the current day
-- and week (:day and :week are local dates in the team's time zone): team_seats
-- (db/functions/seats.sql), which the planner inlines.
SELECT id, weight, turns, position, crm_user_id, name, active, away_from, away_until,
       day_count, week_count
FROM team_seats(CAST(:org AS text), CAST(:team_id AS bigint), CAST(:day AS date),
                CAST(:week AS date))
ORDER BY position

-- name: lock_team_seats
-- lock_team and team_candidates (team_seats) in one call (db/functions/seats.sql), for a batch: the
-- team's id and epoch on every row; no row when the team is not in the database, one row with
-- the member columns NULL when it has no configured member. :day and :week are those of the
-- router's last time read (its previous batch's, or this batch's own when route_plain_batch
-- left it to the general path); the caller reads team_candidates again when its clock, read
-- under the lock, is on another day or week.
SELECT team_id, epoch, id, weight, turns, position, crm_user_id, name, active, away_from,
       away_until, day_count, week_count
FROM lock_team_seats(CAST(:org AS text), CAST(:name AS text), CAST(:day AS date),
                     CAST(:week AS date))

-- name: recent_owners
-- The team's latest owners, newest first (the team lock orders its assignments' ids).
SELECT member_id FROM assignments WHERE team_id = :team_id ORDER BY id DESC LIMIT :k

-- name: record_assignments
-- Assignment ids follow the order of the picks (WITH ORDINALITY ... ORDER BY ord), so ordering
-- a team's assignments by id replays its rotation exactly (`connector simulate` relies on it).
-- The picks' decisions are written by the same statement: :details is ONE JSON array of
-- distinct decisions and :detail_of each pick's position in it, 0-based (a batch's picks
-- mostly share one; NULL, or a list shorter than the picks: that pick gets none), and
-- :sla_minutes sets each assignment's SLA check time as it is inserted. The outbox row takes
-- the lead's id and parent from the picks, not from a join with leads, and its received_at
-- as now(): every lead picked here was inserted by this transaction (insert_leads), whose
-- now() its received_at defaulted to (test_dashboard_latency compares the two). A pick's
-- part of its decision goes in columns (read through decision_details), no JSON: the batch
-- (:batch), the epoch, the member picked and the seats it was picked among, as :seat_sets
-- (each pick's set of candidates, 1-based, into :set_starts / :set_lens, which slice :set_ids,
-- :set_weights and :set_skips: a batch's picks mostly share one set) and :count_starts
-- (where its counts start in :seat_counts, one run of the set's length). A pick with no
-- set (NULL) keeps those parts in its JSON detail.
WITH picks AS (
    SELECT *
    FROM ROWS FROM (unnest(CAST(:lead_ids AS bigint[])), unnest(CAST(:member_ids AS bigint[])),
                    unnest(CAST(:rule_indexes AS integer[])), unnest(CAST(:rule_names AS text[])),
                    unnest(CAST(:crm_ids AS text[])), unnest(CAST(:parent_ids AS text[])),
                    unnest(CAST(:sla_minutes AS integer[])),
                    unnest(CAST(:detail_of AS integer[])),
                    unnest(CAST(:seat_sets AS integer[])),
                    unnest(CAST(:count_starts AS integer[])))
         WITH ORDINALITY AS p (lead_id, member_id, rule_index, rule_name, crm_id, parent_id,
                               sla_minutes, detail_of, seat_set, count_start, ord)
    WHERE p.lead_id IS NOT NULL
), sets AS (
    SELECT *
    FROM ROWS FROM (unnest(CAST(:set_starts AS integer[])), unnest(CAST(:set_lens AS integer[])))
         WITH ORDINALITY AS s (start, len, n)
), seat_arrays AS MATERIALIZED (
    -- cast once (the JSON parsed once): a cast written in the per-pick expressions below
    -- would convert the whole array, or parse the whole JSON, for every pick once the
    -- statement runs on its generic plan (35 us a pick when the slices were cast per pick)
    SELECT CAST(:set_ids AS bigint[]) AS ids, CAST(:set_weights AS integer[]) AS weights,
           CAST(:set_skips AS text[]) AS skips, CAST(:seat_counts AS bigint[]) AS counts,
           CAST(:details AS jsonb) AS details
), per_member AS (
    SELECT member_id, count(*) AS n FROM picks GROUP BY member_id
), credits AS (
    -- turns the rotation credited to reps it passed over (see connector/routing/rotation.py)
    SELECT * FROM unnest(CAST(:credit_ids AS bigint[]), CAST(:credit_ns AS bigint[]))
         AS c (member_id, n)
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
    SELECT pm.member_id, k.period, k.starts_on, pm.n
    FROM per_member pm
    CROSS JOIN (VALUES ('day', CAST(:day AS date)), ('week', CAST(:week AS date)))
         AS k (period, starts_on)
    ON CONFLICT (member_id, period, starts_on)
    DO UPDATE SET assigned = member_load.assigned + EXCLUDED.assigned
    RETURNING member_id
), assigned AS (
    INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                             rule_index, rule_name, source, sla_due_at)
    SELECT p.lead_id, :org, :team_id, p.member_id, m.crm_user_id, :epoch,
           p.rule_index, p.rule_name, :source, now() + make_interval(mins => p.sla_minutes)
    FROM picks p JOIN members m ON m.id = p.member_id
    ORDER BY p.ord
    RETURNING id, lead_id, crm_user_id
), decided AS (
    INSERT INTO routing_decisions (org, lead_id, kind, detail, batch, epoch, chosen_id,
                                   seat_ids, seat_weights, seat_counts, seat_skips)
    SELECT :org, p.lead_id, 'route', x.details -> p.detail_of,
           CASE WHEN s.n IS NOT NULL THEN CAST(:batch AS bigint) END,
           CASE WHEN s.n IS NOT NULL THEN CAST(:epoch AS integer) END,
           CASE WHEN s.n IS NOT NULL THEN p.member_id END,
           x.ids[s.start:s.start + s.len - 1], x.weights[s.start:s.start + s.len - 1],
           x.counts[p.count_start:p.count_start + s.len - 1],
           x.skips[s.start:s.start + s.len - 1]
    FROM picks p LEFT JOIN sets s ON s.n = p.seat_set CROSS JOIN seat_arrays x
    WHERE x.details -> p.detail_of IS NOT NULL
    -- in pick order, unsorted: a lead has one decision here, readers order a lead's
    -- decisions by id, and sorting these wide rows (JSON and seat arrays) under the lock
    -- served no reader (BENCHMARKS.md, the runs of 2026-12-04 18:57-19:20 UTC)
    RETURNING lead_id
)
INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                    lead_received_at)
SELECT :org, a.lead_id, a.id, :crm_object, p.crm_id, a.crm_user_id, p.parent_id, now()
FROM assigned a JOIN picks p ON p.lead_id = a.lead_id
RETURNING lead_id

-- name: route_plain_batch
-- A batch's leads of one plain team (equal weights, no caps, no catch-up, nobody blocked by
-- the config at :now), already inserted by this transaction, decided and recorded in ONE
-- call (db/functions/routing.sql): the team row is locked for this call plus the commit. The same
-- parameters and records as record_assignments; the picks, epoch and seats come back.
-- Status 'general': nothing written, the general path decides the batch (the team's lock
-- is held when the checks failed only under it, not when they failed before it).
SELECT status, epoch, member_ids, seat_ids, seat_skips, seat_users, seat_names
FROM route_plain_batch(
    CAST(:org AS text), CAST(:crm_object AS text), CAST(:source AS text),
    CAST(:team AS text), CAST(:now AS timestamptz), CAST(:day AS date), CAST(:week AS date),
    CAST(:batch AS bigint), CAST(:lead_ids AS bigint[]), CAST(:crm_ids AS text[]),
    CAST(:parent_ids AS text[]), CAST(:rule_indexes AS integer[]),
    CAST(:rule_names AS text[]), CAST(:sla_minutes AS integer[]),
    CAST(:detail_of AS integer[]), CAST(:details AS jsonb))

-- name: mark_unassigned
UPDATE leads SET unassigned_reason = :reason WHERE id = ANY(CAST(:lead_ids AS bigint[]))

-- name: route_plain
-- One new lead of a PLAIN team (connector/routing/single.py plain_call) in ONE call of two
-- statements (db/functions/routing.sql): route_lead's work and records, or status 'route_lead' with
-- nothing left written when route_lead must decide it. It writes the pick's part of its
-- decision in columns (read through decision_details).
SELECT status, lead_id, team, owner_id, owner_name, reason, cand_ids, cand_skips
FROM route_plain(
    CAST(:org AS text), CAST(:crm_object AS text), CAST(:source AS text),
    CAST(:crm_id AS text), CAST(:fields AS jsonb), CAST(:parent_id AS text),
    CAST(:team AS text), CAST(:rule_index AS integer), CAST(:rule_name AS text),
    CAST(:now AS timestamptz), CAST(:day AS date), CAST(:week AS date),
    CAST(:detail AS jsonb), CAST(:sla_minutes AS integer))

-- name: route_lead
-- One new lead of a rotation rule, decided and recorded in ONE call (db/functions/routing.sql):
-- the team row is locked for this statement plus the commit. What only the config knows is
-- passed in.
SELECT status, lead_id, team, owner_id, owner_name, reason, cand_ids, cand_skips
FROM route_lead(
    CAST(:org AS text), CAST(:crm_object AS text), CAST(:source AS text),
    CAST(:crm_id AS text), CAST(:fields AS jsonb), CAST(:parent_id AS text),
    CAST(:team AS text), CAST(:rule_index AS integer), CAST(:rule_name AS text),
    CAST(:now AS timestamptz), CAST(:day AS date), CAST(:week AS date),
    CAST(:users AS text[]), CAST(:blocked AS text[]), CAST(:per_day AS integer[]),
    CAST(:per_week AS integer[]), CAST(:team_per_day AS integer),
    CAST(:team_per_week AS integer), CAST(:max_in_a_row AS integer),
    CAST(:detail AS jsonb), CAST(:sla_minutes AS integer))
