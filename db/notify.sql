-- Named SQL for notifications (connector/notify/): the org's settings, the dispatchers'
-- claims (as the outbox's: SKIP LOCKED under a lease, a finish that touches only rows still
-- claimed with the same token), the admin alerts' figures, and listing/retrying dead rows.
-- No Slack or SMTP call happens inside a transaction.

-- name: upsert_settings
INSERT INTO notify_settings (org, channels, opted_out)
VALUES (:org, CAST(:channels AS text[]), CAST(:opted_out AS text[]))
ON CONFLICT (org) DO UPDATE
SET channels = EXCLUDED.channels, opted_out = EXCLUDED.opted_out, updated_at = now()
WHERE (notify_settings.channels, notify_settings.opted_out)
      IS DISTINCT FROM (EXCLUDED.channels, EXCLUDED.opted_out)

-- name: delete_settings
DELETE FROM notify_settings WHERE org = :org

-- name: rescue_expired
UPDATE notifications SET state = 'pending', claimed_by = NULL, lease_until = NULL
WHERE org = :org AND state = 'claimed' AND lease_until < now()
RETURNING id

-- name: claim
-- Up to :limit ready rows, oldest first, with what their messages say: the lead (its CRM id
-- and fields), its current assignment (team, rule, owner) and the recipient's time off set by
-- `connector rep away`.
WITH ready AS (
    SELECT n.id FROM notifications n
    WHERE n.org = :org AND n.state = 'pending' AND n.available_at <= now()
    ORDER BY n.id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE notifications n
    SET state = 'claimed', claimed_by = :token, attempts = n.attempts + 1,
        lease_until = now() + make_interval(secs => :lease_seconds)
    FROM ready
    WHERE n.id = ready.id
    RETURNING n.id, n.kind, n.channel, n.recipient, n.lead_id, n.detail, n.dedupe_key,
              n.attempts, n.held_since, n.created_at
)
SELECT c.id, c.kind, c.channel, c.recipient, c.lead_id, c.detail, c.dedupe_key, c.attempts,
       c.held_since, c.created_at, l.crm_id, l.fields, t.name AS team, a.rule_name,
       a.crm_user_id AS owner_id, o.starts_at AS away_from, o.until AS away_until
FROM claimed c
LEFT JOIN leads l ON l.id = c.lead_id
LEFT JOIN assignments a ON a.lead_id = c.lead_id
LEFT JOIN teams t ON t.id = a.team_id
LEFT JOIN rep_time_off o ON o.org = :org AND o.crm_user_id = c.recipient
ORDER BY c.id

-- name: finish
-- One statement records a round: sent (with the key of the message that carried the row),
-- dead (with the reason), pending again after a delay (a retry), or held (pending, marked
-- held_since: the rep is quiet; it goes out in a digest). :refunds gives back the attempt of
-- a row that was not tried (rate limited before sending, or held).
UPDATE notifications n
SET state = CASE WHEN f.state = 'held' THEN 'pending' ELSE f.state END,
    finished_at = CASE WHEN f.state IN ('sent', 'dead') THEN now() END,
    claimed_by = CASE WHEN f.state IN ('sent', 'dead') THEN n.claimed_by END,
    lease_until = NULL,
    last_error = f.error,
    sent_as = f.sent_as,
    attempts = n.attempts - f.refund,
    held_since = CASE WHEN f.state = 'held' THEN coalesce(n.held_since, now())
                      ELSE n.held_since END,
    available_at = CASE WHEN f.state IN ('pending', 'held')
                        THEN now() + make_interval(secs => f.delay) ELSE n.available_at END
FROM unnest(CAST(:ids AS bigint[]), CAST(:states AS text[]), CAST(:errors AS text[]),
            CAST(:delays AS float8[]), CAST(:refunds AS bigint[]), CAST(:sent_as AS text[]))
     AS f (id, state, error, delay, refund, sent_as)
WHERE n.id = f.id AND n.state = 'claimed' AND n.claimed_by = :token
RETURNING n.id

-- name: next_due
SELECT min(available_at) AS next_at FROM notifications WHERE org = :org AND state = 'pending'

-- name: list_finished
SELECT id, kind, channel, recipient, lead_id, attempts, last_error, finished_at
FROM notifications
WHERE org = :org AND state = :state
ORDER BY id LIMIT :limit

-- name: retry_dead
UPDATE notifications
SET state = 'pending', attempts = 0, available_at = now(), finished_at = NULL,
    claimed_by = NULL, last_error = NULL
WHERE org = :org AND state = 'dead'
  AND (CAST(:ids AS bigint[]) IS NULL OR id = ANY (CAST(:ids AS bigint[])))
RETURNING id

-- name: queue_alert
-- One admin alert per kind, interval and channel: the dedupe key makes a repeat a no-op.
INSERT INTO notifications (org, kind, channel, recipient, detail, dedupe_key)
SELECT :org, 'alert', c.channel, 'admins', CAST(:detail AS jsonb),
       'alert:' || :alert || ':' || :bucket || ':' || c.channel
FROM unnest(CAST(:channels AS text[])) AS c (channel)
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id

-- name: alert_figures
-- What the admin alerts report for the window from :since to now.
SELECT
    (SELECT count(*) FROM outbox
     WHERE org = :org AND state = 'dead' AND finished_at >= :since) AS dead,
    (SELECT count(*) FROM outbox
     WHERE org = :org AND state = 'superseded' AND finished_at >= :since) AS superseded,
    (SELECT count(*) FROM assignment_history
     WHERE org = :org AND ended_reason = 'sla_expired' AND ended_at >= :since) AS sla_rerouted,
    (SELECT extract(epoch FROM now() - min(received_at)) FROM intake_events
     WHERE org = :org AND state IN ('pending', 'claimed')) AS inbox_age,
    (SELECT extract(epoch FROM now() - min(created_at)) FROM outbox
     WHERE org = :org AND state IN ('pending', 'claimed')) AS outbox_age,
    (SELECT reason FROM org_pauses WHERE org = :org AND until > now()) AS paused_reason,
    (SELECT until FROM org_pauses WHERE org = :org AND until > now()) AS paused_until,
    (SELECT count(*) FROM notifications
     WHERE org = :org AND state = 'dead' AND kind <> 'alert' AND finished_at >= :since)
        AS notify_dead,
    now() AS now
