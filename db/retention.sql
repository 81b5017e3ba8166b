-- Named SQL for retention: received field values and finished rows older than the org's
-- retention_days are removed in small batches (short transactions, no long locks). What
-- `status` and the fairness report need stays: leads (ids, team, owner), assignments and
-- members' counts.

-- name: try_lock
SELECT pg_try_advisory_xact_lock(hashtext('lead-routing-connector:purge'), hashtext(:org))

-- name: clear_fields
UPDATE leads SET fields = '{}'::jsonb
WHERE id IN (
    SELECT id FROM leads
    WHERE org = :org AND received_at < now() - make_interval(days => :days)
      AND fields <> '{}'::jsonb
    LIMIT :batch)
RETURNING id

-- name: delete_events
DELETE FROM intake_events
WHERE id IN (
    SELECT id FROM intake_events
    WHERE org = :org AND state IN ('done', 'skipped')
      AND finished_at < now() - make_interval(days => :days)
    LIMIT :batch)
RETURNING id

-- name: delete_outbox
DELETE FROM outbox
WHERE id IN (
    SELECT id FROM outbox
    WHERE org = :org AND state IN ('sent', 'superseded')
      AND finished_at < now() - make_interval(days => :days)
    LIMIT :batch)
RETURNING id

-- name: delete_notifications
-- Sent notifications (their messages are in Slack and the mailboxes); dead ones stay for
-- `connector notify list|retry`.
DELETE FROM notifications
WHERE id IN (
    SELECT id FROM notifications
    WHERE org = :org AND state = 'sent'
      AND finished_at < now() - make_interval(days => :days)
    LIMIT :batch)
RETURNING id

-- name: delete_skips
DELETE FROM skipped_records
WHERE (org, crm_object, crm_id) IN (
    SELECT org, crm_object, crm_id FROM skipped_records
    WHERE org = :org AND last_seen_at < now() - make_interval(days => :days)
    LIMIT :batch)
RETURNING crm_id

-- name: clear_decision_values
-- A recorded decision quotes the field values its rules looked at; they go with the fields.
UPDATE routing_decisions SET detail = detail - 'values'
WHERE id IN (
    SELECT id FROM routing_decisions
    WHERE org = :org AND made_at < now() - make_interval(days => :days)
      AND detail -> 'values' IS NOT NULL
    LIMIT :batch)
RETURNING id
