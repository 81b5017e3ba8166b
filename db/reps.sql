-- Named SQL for `connector rep`: time off set from the command line.

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
