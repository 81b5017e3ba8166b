-- Named SQL for `connector explain`: everything recorded about one lead, read-only.

-- name: lead
SELECT id, crm_id, crm_object, source, received_at, unassigned_reason
FROM leads
WHERE org = :org AND crm_object = :crm_object AND crm_id = :crm_id AND merged_into IS NULL

-- name: events
-- Pushes that named this record (intake_events keeps the id as it arrived: Salesforce ids
-- are compared in their 18-character form).
SELECT id, source, event_key, state, attempts, last_error, received_at, finished_at
FROM intake_events
WHERE org = :org AND crm_object = :crm_object
  AND (crm_id = :crm_id OR (CAST(:salesforce AS boolean) AND salesforce_id_18(crm_id) = :crm_id))
ORDER BY id

-- name: skips
SELECT reason, owner_found, source, times, first_seen_at, last_seen_at
FROM skipped_records
WHERE org = :org AND crm_object = :crm_object AND crm_id = :crm_id

-- name: decisions
-- decision_details (db/functions/decisions.sql): routing_decisions with the pick's columns
-- folded into detail
SELECT id, kind, detail, made_at FROM decision_details WHERE lead_id = :lead_id ORDER BY id

-- name: current
SELECT a.id, a.crm_user_id, m.name, t.name AS team, a.reason, a.note, a.assigned_at,
       a.sla_due_at, a.rule_name
FROM assignments a JOIN members m ON m.id = a.member_id JOIN teams t ON t.id = a.team_id
WHERE a.lead_id = :lead_id

-- name: history
SELECT h.crm_user_id, m.name, t.name AS team, h.reason, h.note, h.assigned_at, h.ended_at,
       h.ended_reason
FROM assignment_history h JOIN members m ON m.id = h.member_id JOIN teams t ON t.id = h.team_id
WHERE h.lead_id = :lead_id
ORDER BY h.id

-- name: writes
SELECT id, owner_id, state, attempts, last_error, found_owner, replaces_owners, created_at,
       finished_at
FROM outbox WHERE lead_id = :lead_id ORDER BY id

-- name: members
-- Who the member ids of compactly recorded picks are (connector/routing/decisions.py `expand`).
SELECT id, crm_user_id, name FROM members WHERE id = ANY(CAST(:ids AS bigint[]))
