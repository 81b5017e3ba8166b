-- Named SQL for `connector simulate` (read-only: run in a READ ONLY transaction).

-- name: history
-- The org's stored leads received since :since, with what routing decided when each arrived:
-- a lead reassigned since (reassign, rep deactivation, SLA) is given its first owner, the one
-- its assignment row had before the first reassignment (the row keeps its id, so its place in
-- the team's lock order). Merged copies (a second id form of one record) are left out: their
-- winner stands for them.
SELECT l.id AS lead_id, l.crm_id, l.fields, l.received_at, l.unassigned_reason,
       a.id AS assignment_id, t.name AS team,
       COALESCE(f.crm_user_id, a.crm_user_id) AS owner, COALESCE(f.epoch, a.epoch) AS epoch,
       (f.crm_user_id IS NOT NULL) AS reassigned, ct.name AS current_team
FROM leads l
LEFT JOIN assignments a ON a.lead_id = l.id
LEFT JOIN LATERAL (
    SELECT h.team_id, h.crm_user_id, h.epoch
    FROM assignment_history h WHERE h.lead_id = l.id ORDER BY h.id LIMIT 1
) f ON true
LEFT JOIN teams t ON t.id = COALESCE(f.team_id, a.team_id)
LEFT JOIN teams ct ON ct.id = a.team_id
WHERE l.org = :org AND l.merged_into IS NULL AND l.received_at >= :since
ORDER BY l.received_at, l.id

-- name: teams
-- Each team's rotation as the database has it now: epoch, fingerprint and members.
SELECT t.id AS team_id, t.name AS team, t.epoch, t.fingerprint, m.crm_user_id, m.name
FROM teams t JOIN members m ON m.team_id = t.id
WHERE t.org = :org
ORDER BY t.name, m.position, m.crm_user_id

-- name: counts_before
-- How many leads each member received in its team's epoch before the window: the rotation
-- state the replay starts from when a team's rotation is unchanged. Every version of an
-- assignment is one lead received (the routed one, and each reassignment, which counts for
-- the rep who got the lead and is never taken back from the one who lost it).
SELECT t.name AS team, v.epoch, v.crm_user_id, count(*) AS n
FROM (
    SELECT lead_id, team_id, epoch, crm_user_id FROM assignments WHERE org = :org
    UNION ALL
    SELECT lead_id, team_id, epoch, crm_user_id FROM assignment_history WHERE org = :org
) v
JOIN teams t ON t.id = v.team_id
JOIN leads l ON l.id = v.lead_id
WHERE l.merged_into IS NULL AND l.received_at < :since
GROUP BY t.name, v.epoch, v.crm_user_id
