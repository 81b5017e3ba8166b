-- Named SQL read by the Prometheus collector at scrape time (cheap: partial indexes).

-- name: outbox_gauges
-- Claimed rows through their lease (no index holds them by state).
SELECT org, state, count(*) AS n,
       EXTRACT(EPOCH FROM now() - min(created_at))::float8 AS oldest_age
FROM outbox
WHERE state IN ('pending', 'dead', 'superseded') OR (state = 'claimed' AND lease_until IS NOT NULL)
GROUP BY org, state

-- name: inbox_gauges
-- Pending events (intake_events_pending) and claimed ones (intake_events_leased: a claimed
-- event holds a lease), each through its own partial index.
SELECT org, count(*) AS n,
       EXTRACT(EPOCH FROM now() - min(received_at))::float8 AS oldest_age
FROM intake_events
WHERE state = 'pending' OR (state = 'claimed' AND lease_until IS NOT NULL)
GROUP BY org
