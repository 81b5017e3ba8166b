-- Named SQL for assignment. Statement order inside one transaction matters:
--   insert_leads (sorted by CRM id) -> lock_team (teams sorted by name) -> team_seats
--   -> record_assignments -> record_decisions (decisions.sql) -> COMMIT.
-- team_seats (and active_seats, which bench/harness.py uses) must be its own statement: under READ COMMITTED each statement takes a fresh
-- snapshot, so reading the seats AFTER lock_team returned sees the counts the previous lock
-- holder committed. Reading them in the locking statement would see stale counts.

-- name: insert_leads
INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
SELECT :org, :crm_object, t.crm_id, t.fields::jsonb, t.parent_id, :source
FROM unnest(CAST(:crm_ids AS text[]), CAST(:fields AS text[]), CAST(:parent_ids AS text[]))
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

-- name: active_seats
SELECT id, weight, assigned_in_epoch, position, crm_user_id, name
FROM members
WHERE team_id = :team_id AND active AND in_config
ORDER BY position

-- name: team_seats
-- Every configured member, eligible or not: the router records why each one was skipped.
SELECT id, weight, assigned_in_epoch, position, crm_user_id, name, active
FROM members
WHERE team_id = :team_id AND in_config
ORDER BY position

-- name: record_assignments
-- Assignment ids follow the order of the picks (WITH ORDINALITY ... ORDER BY ord), so ordering
-- a team's assignments by id replays its rotation exactly (`connector simulate` relies on it).
WITH picks AS (
    SELECT *
    FROM unnest(CAST(:lead_ids AS bigint[]), CAST(:member_ids AS bigint[]),
                CAST(:rule_indexes AS integer[]), CAST(:rule_names AS text[]))
         WITH ORDINALITY AS p (lead_id, member_id, rule_index, rule_name, ord)
), per_member AS (
    SELECT member_id, count(*) AS n FROM picks GROUP BY member_id
), bump AS (
    UPDATE members m
    SET assigned_in_epoch = m.assigned_in_epoch + per_member.n
    FROM per_member
    WHERE m.id = per_member.member_id
    RETURNING m.id
), assigned AS (
    INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                             rule_index, rule_name, source)
    SELECT p.lead_id, :org, :team_id, p.member_id, m.crm_user_id, :epoch,
           p.rule_index, p.rule_name, :source
    FROM picks p JOIN members m ON m.id = p.member_id
    ORDER BY p.ord
    RETURNING id, lead_id, crm_user_id
)
INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id)
SELECT :org, assigned.lead_id, assigned.id, l.crm_object, l.crm_id, assigned.crm_user_id,
       l.parent_id
FROM assigned JOIN leads l ON l.id = assigned.lead_id
RETURNING lead_id

-- name: mark_unassigned
UPDATE leads SET unassigned_reason = :reason WHERE id = ANY(CAST(:lead_ids AS bigint[]))
