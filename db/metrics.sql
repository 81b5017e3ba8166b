-- Named SQL read by the Prometheus collector at scrape time (cheap: partial indexes).

-- name: outbox_gauges
SELECT org, state, count(*) AS n,
       EXTRACT(EPOCH FROM now() - min(created_at))::float8 AS oldest_age
FROM outbox
WHERE state IN ('pending', 'claimed', 'dead', 'superseded')
GROUP BY org, state

-- name: inbox_gauges
SELECT org, count(*) AS n,
       EXTRACT(EPOCH FROM now() - min(received_at))::float8 AS oldest_age
FROM intake_events
WHERE state IN ('pending', 'claimed')
GROUP BY org
