-- Named SQL for `connector status` (and the dashboard's totals page, which runs the same).
-- Every count is read from an index (index-only scans once VACUUM has marked the pages
-- all-visible), never by joining leads to assignments: BENCHMARKS.md has the plans at
-- 1,000,000 leads. A merged lead (merged_into set) is a second copy of its winner's record
-- and is not counted; merged leads are rare, so their
-- assignments are counted apart (leads_org_merged) and subtracted. An assignment's org is
-- its lead's org (the router writes both from the same org).

-- name: lead_counts
SELECT (SELECT count(*) FROM leads WHERE org = :org AND merged_into IS NULL) AS total,
       (SELECT count(*) FROM assignments WHERE org = :org)
       - (SELECT count(*)
          FROM leads l JOIN assignments a ON a.lead_id = l.id
          WHERE l.org = :org AND l.merged_into IS NOT NULL) AS assigned

-- name: member_counts
-- Per member: its assignments (assignments_member) and, of those, the leads given to their
-- account's owner rather than by a turn of the rotation (assignments_account_matched), each
-- less its merged leads' assignments.
WITH merged AS MATERIALIZED (
    SELECT a.member_id, a.account_match->>'result' = 'matched' AS account_matched
    FROM leads l JOIN assignments a ON a.lead_id = l.id
    WHERE l.org = :org AND l.merged_into IS NOT NULL
)
SELECT t.name AS team, m.crm_user_id, m.name, m.weight, m.active, m.in_config,
       (SELECT count(*) FROM assignments a WHERE a.member_id = m.id)
       - (SELECT count(*) FROM merged WHERE merged.member_id = m.id) AS assigned,
       (SELECT count(*) FROM assignments a
        WHERE a.member_id = m.id AND a.account_match->>'result' = 'matched')
       - (SELECT count(*) FROM merged WHERE merged.member_id = m.id AND merged.account_matched)
         AS account_matched
FROM teams t JOIN members m ON m.team_id = t.id
WHERE t.org = :org AND t.in_config
ORDER BY t.name, m.position, m.crm_user_id

-- name: outbox_counts
-- One index range per state (a plain GROUP BY reads the whole table): outbox_org_state_id,
-- which leaves the claimed rows out, and outbox_leased for those.
SELECT 'pending' AS state,
       (SELECT count(*) FROM outbox WHERE org = :org AND state = 'pending') AS n
UNION ALL
SELECT 'claimed',
       (SELECT count(*) FROM outbox
        WHERE org = :org AND state = 'claimed' AND lease_until IS NOT NULL)
UNION ALL
SELECT 'sent', (SELECT count(*) FROM outbox WHERE org = :org AND state = 'sent')
UNION ALL
SELECT 'dead', (SELECT count(*) FROM outbox WHERE org = :org AND state = 'dead')
UNION ALL
SELECT 'superseded', (SELECT count(*) FROM outbox WHERE org = :org AND state = 'superseded')

-- name: skipped_counts
SELECT reason, count(*) AS n FROM skipped_records WHERE org = :org GROUP BY reason

-- name: inbox_counts
SELECT state, count(*) AS n FROM intake_events WHERE org = :org GROUP BY state
