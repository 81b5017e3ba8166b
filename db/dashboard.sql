-- Named SQL for the operator's dashboard (connector/shell/dashboard). Every query reads one
-- org through an index (BENCHMARKS.md has the plans at 1,000,000 leads); the all-time
-- figures come from status.sql, the same queries as `connector status`.

-- name: no_jit
-- The org page's first statement, in its read's transaction: its queries read at most a
-- week's rows, each through an index, and JIT compilation (planned when an estimate passes
-- jit_above_cost, as the latency query's fallback lookup inflates its own) took 20 ms of
-- that query's 65 ms at 1,000,000 leads.
SET LOCAL jit = off

-- name: members
-- The org's configured teams and their members (weights and whether they take leads now).
SELECT t.id AS team_id, t.name AS team, m.id AS member_id, m.crm_user_id, m.name, m.weight,
       (m.active AND m.in_config) AS active, m.position
FROM teams t JOIN members m ON m.team_id = t.id
WHERE t.org = :org AND t.in_config
ORDER BY t.name, m.position, m.crm_user_id

-- name: window_counts
-- Leads each member got since the given time (index-only scan of assignments_org_time).
SELECT team_id, member_id, count(*) AS n
FROM assignments
WHERE org = :org AND assigned_at >= :since
GROUP BY team_id, member_id

-- name: latency_buckets
-- Lead received -> owner seen by the CRM (the outbox row finished as 'sent'), in seconds,
-- per bucket since the given time: a range scan of outbox_finished. The lead's received_at is
-- on the outbox row; only a row without that copy looks its lead up, by
-- primary key (a scalar subquery, evaluated only when the copy is missing, so the planner
-- cannot turn it into a hash join that reads every lead: 1.1 s at 1,000,000 leads).
WITH sent AS MATERIALIZED (
    SELECT o.finished_at,
           extract(epoch FROM o.finished_at
                   - coalesce(o.lead_received_at,
                              (SELECT l.received_at FROM leads l WHERE l.id = o.lead_id)))
               AS seconds
    FROM outbox o
    WHERE o.state = 'sent' AND o.finished_at >= :since AND o.org = :org
)
SELECT date_bin(CAST(:bucket AS interval), finished_at, CAST(:origin AS timestamptz)) AS bucket,
       count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY seconds) AS p99
FROM sent
GROUP BY 1
ORDER BY 1

-- name: outbox_depth
-- Rows by state, except 'sent' (that count grows forever; `status` has it). Claimed rows are
-- read through their lease (no index holds them by state).
SELECT state, count(*) AS n
FROM outbox
WHERE org = :org
  AND (state IN ('pending', 'dead', 'superseded') OR (state = 'claimed' AND lease_until IS NOT NULL))
GROUP BY state

-- name: oldest_open
-- The oldest row the CRM has not seen yet (outbox_open_age: unfinished rows are the pending
-- and claimed ones).
SELECT id, lead_id, crm_id, state, attempts, created_at, available_at, last_error
FROM outbox
WHERE org = :org AND finished_at IS NULL AND state IN ('pending', 'claimed')
ORDER BY created_at, id
LIMIT 1

-- name: finished_rows
-- Dead rows (with the CRM's reason) or superseded ones (with the owner found), newest first.
SELECT id, lead_id, crm_object, crm_id, owner_id, found_owner, attempts, last_error,
       finished_at, state
FROM outbox
WHERE org = :org AND state = :state AND state <> 'claimed'  -- (the predicate of outbox_org_state_id)
ORDER BY id DESC
LIMIT :limit

-- name: recent_decisions
-- The latest assignments, newest first (backward scan of assignments_org_time).
SELECT a.assigned_at, a.lead_id, l.crm_object, l.crm_id, a.source, a.rule_name,
       t.name AS team, m.name AS rep, a.crm_user_id
FROM assignments a
JOIN leads l ON l.id = a.lead_id
JOIN teams t ON t.id = a.team_id
JOIN members m ON m.id = a.member_id
WHERE a.org = :org
ORDER BY a.assigned_at DESC, a.id DESC
LIMIT :limit

-- name: lead
SELECT id, crm_object, crm_id, parent_id, source, received_at, unassigned_reason, merged_into,
       fields
FROM leads
WHERE org = :org AND id = :lead_id

-- name: lead_assignment
SELECT a.id, a.assigned_at, a.source, a.rule_index, a.rule_name, a.epoch, a.crm_user_id,
       t.name AS team, m.name AS rep, m.weight
FROM assignments a
JOIN teams t ON t.id = a.team_id
JOIN members m ON m.id = a.member_id
WHERE a.lead_id = :lead_id

-- name: lead_outbox
SELECT id, state, owner_id, found_owner, attempts, last_error, created_at, available_at,
       finished_at
FROM outbox
WHERE lead_id = :lead_id
ORDER BY id

-- name: lead_events
-- The pushes (Salesforce Outbound Message, HubSpot webhook) that named the lead's record.
SELECT id, source, event_key, state, attempts, last_error, received_at, finished_at
FROM intake_events
WHERE org = :org AND crm_id = :crm_id AND crm_object = :crm_object
ORDER BY id

-- name: lead_skipped
SELECT reason, owner_found, source, times, first_seen_at, last_seen_at
FROM skipped_records
WHERE org = :org AND crm_object = :crm_object AND crm_id = :crm_id
