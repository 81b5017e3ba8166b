-- Named SQL for assignment. Statement order inside one transaction matters:
--   insert_leads (sorted by CRM id) -> [lock_teams: every team the batch may go to, in name
--   order, when it is more than one team or account owners' leads are recorded] ->
--   route_team per team, in overflow order (each locks its team, reads the members under
--   the lock, picks and records) -> record_decisions (decisions.sql: the other leads'
--   decisions) -> COMMIT. A single new lead takes route_new_lead: its insert and route_team in
--   one call. The functions are in db/functions/ (route_team, route_new_lead, rotation_picks,
--   record_assignments).

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

-- name: lock_teams
-- The teams a batch may go to, locked in name order (so two batches never deadlock); the
-- rows come back in that order (a team missing from the database is missing here).
SELECT id, name, epoch FROM teams
WHERE org = :org AND name = ANY(CAST(:names AS text[])) AND in_config
ORDER BY name
FOR UPDATE

-- name: team_candidates
-- Every configured member (inactive ones too, so a pick can say why each was skipped), its
-- rotation turns, its time off set from the command line, and its leads in the current day
-- and week (:day and :week are local dates in the team's time zone): team_seats, which the
-- planner inlines. Reassignment reads it under the team lock.
SELECT id, weight, turns, position, crm_user_id, name, active, away_from, away_until,
       day_count, week_count
FROM team_seats(CAST(:org AS text), CAST(:team_id AS bigint), CAST(:day AS date),
                CAST(:week AS date))
ORDER BY position

-- name: mark_unassigned
UPDATE leads SET unassigned_reason = :reason WHERE id = ANY(CAST(:lead_ids AS bigint[]))

-- name: route_team
-- A team's leads (stored by this transaction, in turn order) decided and recorded in ONE call:
-- the team row locked, the members read under the lock, the picks (rotation_picks) and every
-- record (record_assignments). Leads nobody can take are recorded unassigned when :final,
-- else returned for the overflow team.
SELECT status, epoch, member_ids, reason, seat_ids, seat_users, seat_names, seat_weights,
       seat_skips, seat_counts, away_by_command
FROM route_team(
    CAST(:org AS text), CAST(:crm_object AS text), CAST(:source AS text), CAST(:team AS text),
    CAST(:now AS timestamptz), CAST(:day AS date), CAST(:week AS date), CAST(:batch AS bigint),
    CAST(:users AS text[]), CAST(:blocked AS text[]), CAST(:per_day AS integer[]),
    CAST(:per_week AS integer[]), CAST(:team_per_day AS integer),
    CAST(:team_per_week AS integer), CAST(:max_in_a_row AS integer),
    CAST(:lead_ids AS bigint[]), CAST(:crm_ids AS text[]), CAST(:parent_ids AS text[]),
    CAST(:rule_indexes AS integer[]), CAST(:rule_names AS text[]),
    CAST(:sla_minutes AS integer[]), CAST(:details AS jsonb), CAST(:detail_of AS integer[]),
    CAST(:final AS boolean), CAST(NULL AS bigint), true)

-- name: route_new_lead
-- One new lead of a rotation rule, stored, decided and recorded in ONE call (route_team on
-- the server): the team row is locked for this statement plus the commit.
SELECT status, lead_id, team, owner_id, owner_name, reason, member_ids, seat_ids, seat_skips
FROM route_new_lead(
    CAST(:org AS text), CAST(:crm_object AS text), CAST(:source AS text),
    CAST(:crm_id AS text), CAST(:fields AS jsonb), CAST(:parent_id AS text),
    CAST(:team AS text), CAST(:rule_index AS integer), CAST(:rule_name AS text),
    CAST(:now AS timestamptz), CAST(:day AS date), CAST(:week AS date),
    CAST(:users AS text[]), CAST(:blocked AS text[]), CAST(:per_day AS integer[]),
    CAST(:per_week AS integer[]), CAST(:team_per_day AS integer),
    CAST(:team_per_week AS integer), CAST(:max_in_a_row AS integer),
    CAST(:detail AS jsonb), CAST(:sla_minutes AS integer))
