-- Named SQL for the HubSpot webhook inbox (see migrations/0002_webhook_inbox.sql).

-- name: insert_events
INSERT INTO webhook_inbox (org, portal_id, event_id, object_id, crm_object, crm_id,
                           occurred_at, fields, state, finished_at)
SELECT :org, t.portal_id, t.event_id, t.object_id, :crm_object, t.object_id::text,
       t.occurred_at, t.fields::jsonb, CAST(:state AS text),
       CASE WHEN CAST(:state AS text) = 'done' THEN now() END
FROM unnest(CAST(:portal_ids AS bigint[]), CAST(:event_ids AS bigint[]),
            CAST(:object_ids AS bigint[]), CAST(:occurred_ats AS bigint[]),
            CAST(:fields AS text[]))
     AS t (portal_id, event_id, object_id, occurred_at, fields)
ORDER BY t.portal_id, t.event_id, t.object_id
ON CONFLICT (org, portal_id, event_id, object_id) DO NOTHING
RETURNING id

-- name: claim
UPDATE webhook_inbox i
SET state = 'claimed', claimed_by = :worker, attempts = i.attempts + 1,
    lease_until = now() + make_interval(secs => :lease_seconds)
WHERE i.id IN (
    SELECT id FROM webhook_inbox
    WHERE org = :org
      AND ((state = 'pending' AND available_at <= now())
           OR (state = 'claimed' AND lease_until < now()))
    ORDER BY id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
RETURNING i.id, i.crm_id, i.occurred_at, i.fields, i.attempts

-- name: finish
UPDATE webhook_inbox
SET state = :state, finished_at = now(), lease_until = NULL, last_error = :note
WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'claimed' AND claimed_by = :worker

-- name: retry_later
UPDATE webhook_inbox
SET state = CASE WHEN attempts >= :max_attempts THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN attempts >= :max_attempts THEN now() END,
    -- Exponential backoff from the attempt count (incremented by claim), capped.
    available_at = now() + make_interval(
        secs => least(CAST(:max_delay AS float8), CAST(:base_delay AS float8) * 2 ^ (attempts - 1))),
    lease_until = NULL, last_error = :error
WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'claimed' AND claimed_by = :worker
