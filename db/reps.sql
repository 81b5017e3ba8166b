-- Named SQL for `connector rep`: time off set from the command line.

-- name: touch_team
-- A new version of a team row of the rep (locked until the transaction ends), written before
-- the time off: a lead of that team waiting for the team lock while this commits sees the
-- team changed and is decided by route_lead, which reads the time off with a fresh snapshot
-- (route_plain's snapshot, taken before its wait, could not see it; migration 0020).
UPDATE teams SET updated_at = now() WHERE org = :org AND name = :name AND in_config

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
