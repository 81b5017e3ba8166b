-- Named SQL for `connector status`.

-- name: lead_counts
-- A merged lead is a second copy of its winner's record: not counted.
SELECT count(*) AS total, count(a.id) AS assigned
FROM leads l LEFT JOIN assignments a ON a.lead_id = l.id
WHERE l.org = :org AND l.merged_into IS NULL

-- name: member_counts
SELECT t.name AS team, m.crm_user_id, m.name, m.weight, m.active, m.in_config,
       (SELECT count(*) FROM assignments a JOIN leads l ON l.id = a.lead_id
        WHERE a.member_id = m.id AND l.merged_into IS NULL) AS assigned,
       -- of those, leads given to their account's owner (not turns of the rotation)
       (SELECT count(*) FROM assignments a JOIN leads l ON l.id = a.lead_id
        WHERE a.member_id = m.id AND l.merged_into IS NULL
          AND a.account_match->>'result' = 'matched') AS account_matched
FROM teams t JOIN members m ON m.team_id = t.id
WHERE t.org = :org AND t.in_config
ORDER BY t.name, m.position, m.crm_user_id

-- name: outbox_counts
SELECT state, count(*) AS n FROM outbox WHERE org = :org GROUP BY state

-- name: skipped_counts
SELECT reason, count(*) AS n FROM skipped_records WHERE org = :org GROUP BY reason

-- name: inbox_counts
SELECT state, count(*) AS n FROM intake_events WHERE org = :org GROUP BY state
