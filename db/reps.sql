-- Named SQL for `connector rep`: time off set from the command line.

-- name: touch_teams
-- A new version of each team row of the rep as the database has it (locked until the
-- transaction ends, in name order as routers and config applies lock teams), written before
-- the time off: the command waits for the leads already queued for those teams' locks, so
-- they are decided as they arrived, and every lead after it sees the time off (route_team
-- reads it under the lock, db/functions/routing.sql).
WITH mine AS (
    SELECT t.id FROM teams t
    WHERE t.org = :org AND t.in_config
      AND EXISTS (SELECT FROM members m
                  WHERE m.team_id = t.id AND m.crm_user_id = :crm_user_id AND m.in_config)
    ORDER BY t.name
    FOR UPDATE OF t
)
UPDATE teams SET updated_at = now() FROM mine WHERE teams.id = mine.id
RETURNING teams.id

-- name: set_away
INSERT INTO rep_time_off (org, crm_user_id, starts_at, until, reason)
VALUES (:org, :crm_user_id, :starts_at, :until, :reason)
ON CONFLICT (org, crm_user_id) DO UPDATE
SET starts_at = EXCLUDED.starts_at, until = EXCLUDED.until, reason = EXCLUDED.reason,
    set_at = now()

-- name: end_away
DELETE FROM rep_time_off WHERE org = :org AND crm_user_id = :crm_user_id RETURNING until

-- name: time_off
SELECT crm_user_id, starts_at, until, reason FROM rep_time_off WHERE org = :org
