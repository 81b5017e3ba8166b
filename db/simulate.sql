-- Named SQL for `connector simulate` (read-only: run in a READ ONLY transaction).

-- name: history
-- The org's stored leads received since :since, with what actually happened to them. Merged
-- copies (a second id form of one record) are left out: their winner stands for them.
SELECT l.id AS lead_id, l.crm_id, l.fields, l.received_at, l.unassigned_reason,
       a.id AS assignment_id, t.name AS team, a.crm_user_id AS owner, a.epoch
FROM leads l
LEFT JOIN assignments a ON a.lead_id = l.id
LEFT JOIN teams t ON t.id = a.team_id
WHERE l.org = :org AND l.merged_into IS NULL AND l.received_at >= :since
ORDER BY l.received_at, l.id

-- name: teams
-- Each team's rotation as the database has it now: epoch, fingerprint and members.
SELECT t.id AS team_id, t.name AS team, t.epoch, t.fingerprint, m.crm_user_id, m.name
FROM teams t JOIN members m ON m.team_id = t.id
WHERE t.org = :org
ORDER BY t.name, m.position, m.crm_user_id

-- name: counts_before
-- How many leads each member had in its team's epoch before the window: the rotation state
-- the replay starts from when a team's rotation is unchanged.
SELECT t.name AS team, a.epoch, a.crm_user_id, count(*) AS n
FROM assignments a
JOIN teams t ON t.id = a.team_id
JOIN leads l ON l.id = a.lead_id
WHERE a.org = :org AND l.merged_into IS NULL AND l.received_at < :since
GROUP BY t.name, a.epoch, a.crm_user_id
