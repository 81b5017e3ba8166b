-- Named SQL for applying the configured teams to the routing state.

-- name: lock_org
SELECT pg_advisory_xact_lock(hashtext('lead-routing-connector:teams'), hashtext(:org))

-- name: upsert_team
INSERT INTO teams (org, name) VALUES (:org, :name)
ON CONFLICT (org, name) DO UPDATE SET in_config = true
RETURNING id, epoch, fingerprint

-- name: members_of
SELECT crm_user_id, weight, active, in_config, position
FROM members WHERE team_id = :team_id ORDER BY position, crm_user_id

-- name: upsert_member
INSERT INTO members (team_id, crm_user_id, name, weight, active, position)
VALUES (:team_id, :crm_user_id, :name, :weight, :active, :position)
ON CONFLICT (team_id, crm_user_id) DO UPDATE
SET name = EXCLUDED.name, weight = EXCLUDED.weight, active = EXCLUDED.active,
    position = EXCLUDED.position, in_config = true

-- name: drop_members
UPDATE members SET in_config = false, active = false
WHERE team_id = :team_id AND in_config AND NOT (crm_user_id = ANY(CAST(:keep AS text[])))

-- name: restart_epoch
WITH reset AS (
    UPDATE members SET assigned_in_epoch = 0, credited_in_epoch = 0 WHERE team_id = :team_id
    RETURNING id
)
UPDATE teams SET epoch = epoch + 1, fingerprint = :fingerprint, updated_at = now()
WHERE id = :team_id

-- name: set_fingerprint
UPDATE teams SET fingerprint = :fingerprint, updated_at = now() WHERE id = :team_id

-- name: retire_teams
UPDATE teams SET in_config = false, updated_at = now()
WHERE org = :org AND in_config AND NOT (name = ANY(CAST(:keep AS text[])))
