-- Named SQL for assignment. Statement order inside one transaction matters:
--   insert_leads (sorted by CRM id) -> lock_team (teams sorted by name, overflow teams
--   included) -> team_candidates [-> recent_owners] -> record_assignments
--   -> record_decisions (decisions.sql) -> COMMIT.
-- team_candidates (like active_seats, which bench/harness.py uses) must be its own statement: under
-- READ COMMITTED each statement takes a fresh
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

-- name: team_candidates
-- Every configured member (inactive ones too, so a pick can say why each was skipped), its
-- rotation turns, its time off set from the command line, and its leads in the current day
-- and week (:day and :week are local dates in the team's time zone).
SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch AS turns, m.position,
       m.crm_user_id, m.name, m.active,
       o.starts_at AS away_from, o.until AS away_until,
       coalesce(d.assigned, 0) AS day_count, coalesce(w.assigned, 0) AS week_count
FROM members m
LEFT JOIN rep_time_off o ON o.org = :org AND o.crm_user_id = m.crm_user_id
LEFT JOIN member_load d ON d.member_id = m.id AND d.period = 'day' AND d.starts_on = :day
LEFT JOIN member_load w ON w.member_id = m.id AND w.period = 'week' AND w.starts_on = :week
WHERE m.team_id = :team_id AND m.in_config
ORDER BY m.position

-- name: recent_owners
-- The team's latest owners, newest first (the team lock orders its assignments' ids).
SELECT member_id FROM assignments WHERE team_id = :team_id ORDER BY id DESC LIMIT :k

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
                             rule_index, rule_name, source)
    SELECT p.lead_id, :org, :team_id, p.member_id, m.crm_user_id, :epoch,
           p.rule_index, p.rule_name, :source
    FROM picks p JOIN members m ON m.id = p.member_id
    ORDER BY p.ord
    RETURNING id, lead_id, crm_user_id
)
INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                    lead_received_at)
SELECT :org, assigned.lead_id, assigned.id, l.crm_object, l.crm_id, assigned.crm_user_id,
       l.parent_id, l.received_at
FROM assigned JOIN leads l ON l.id = assigned.lead_id
RETURNING lead_id

-- name: mark_unassigned
UPDATE leads SET unassigned_reason = :reason WHERE id = ANY(CAST(:lead_ids AS bigint[]))
