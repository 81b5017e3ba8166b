-- Named SQL for the intake inbox (the table intake_events): pushes are stored here by
-- record id, then read back from the CRM and routed by the verify worker.

-- name: insert_events
INSERT INTO intake_events (org, source, event_key, crm_object, crm_id)
SELECT :org, :source, t.event_key, :crm_object, t.crm_id
FROM unnest(CAST(:event_keys AS text[]), CAST(:crm_ids AS text[])) AS t (event_key, crm_id)
ORDER BY t.event_key
ON CONFLICT (org, event_key) DO NOTHING
RETURNING id

-- name: insert_event_batch
-- The receivers' group commit: the events of several deliveries (any orgs) in one statement;
-- what each delivery had new is told by the (org, event_key) pairs returned.
INSERT INTO intake_events (org, source, event_key, crm_object, crm_id)
SELECT t.org, t.source, t.event_key, t.crm_object, t.crm_id
FROM unnest(CAST(:orgs AS text[]), CAST(:sources AS text[]), CAST(:event_keys AS text[]),
            CAST(:crm_objects AS text[]), CAST(:crm_ids AS text[]))
     AS t (org, source, event_key, crm_object, crm_id)
ORDER BY t.org, t.event_key
ON CONFLICT (org, event_key) DO NOTHING
RETURNING org, event_key

-- name: claim
-- Up to :limit ready events from id :floor up, oldest first (connector/core/floor.py says
-- why the floor, and how nothing below it is lost). When more than :unit (the CRM's read
-- batch) are ready, only whole batches are claimed and the rest waits for the next round, so
-- that a paced trickle never pays a CRM call for a few left-over records (:unit 1: all).
UPDATE intake_events i
SET state = 'claimed', claimed_by = :worker, attempts = i.attempts + 1,
    lease_until = now() + make_interval(secs => :lease_seconds)
WHERE i.id IN (
    SELECT r.id FROM (
        SELECT c.id, row_number() OVER (ORDER BY c.id) AS n, count(*) OVER () AS total
        FROM (
            SELECT id FROM intake_events
            WHERE org = :org AND state = 'pending' AND id >= :floor
              AND available_at <= now()
            ORDER BY id
            LIMIT :limit
            FOR UPDATE SKIP LOCKED
        ) c
    ) r
    WHERE r.total <= :unit OR r.n <= r.total - r.total % :unit
)
RETURNING i.id, i.crm_id, i.source, i.attempts

-- name: rescue_expired
-- Claims whose worker died or stalled past its lease are pending again (under their ids); a
-- late result of that worker no longer matches `finish` (claimed_by is cleared).
UPDATE intake_events
SET state = 'pending', claimed_by = NULL, lease_until = NULL
WHERE org = :org AND state = 'claimed' AND lease_until < now()
RETURNING id

-- name: renew
-- A claim being worked on keeps its lease (connector/core/leases.py LeaseKeeper, every
-- quarter of it), in one autocommit statement (a process frozen mid-renewal holds no row
-- lock): only rows still claimed by this worker whose lease has not ended; how many. A row
-- missing was taken back; its late result changes nothing (`finish` checks the worker).
WITH renewed AS (
    UPDATE intake_events SET lease_until = now() + make_interval(secs => :lease_seconds)
    WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'claimed' AND claimed_by = :worker
      AND lease_until > now()
    RETURNING id
)
SELECT count(*) AS n FROM renewed

-- name: already_routed
SELECT crm_id FROM leads
WHERE org = :org AND crm_object = :crm_object AND crm_id = ANY(CAST(:crm_ids AS text[]))
  AND merged_into IS NULL

-- name: finish
UPDATE intake_events i
SET state = f.state, finished_at = now(), lease_until = NULL, last_error = f.note
FROM unnest(CAST(:ids AS bigint[]), CAST(:states AS text[]), CAST(:notes AS text[]))
     AS f (id, state, note)
WHERE i.id = f.id AND i.state = 'claimed' AND i.claimed_by = :worker

-- name: retry_later
-- A quota answer (:rate_limited) is not the event's fault: its attempt is given back, so a
-- 429 storm never dead-letters events, and the CRM's Retry-After (:delay) is the wait.
-- Other failures back off exponentially from the attempt count (incremented by claim).
UPDATE intake_events
SET attempts = attempts - CASE WHEN CAST(:rate_limited AS boolean) THEN 1 ELSE 0 END,
    state = CASE WHEN attempts >= :max_attempts AND NOT CAST(:rate_limited AS boolean)
                 THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN attempts >= :max_attempts AND NOT CAST(:rate_limited AS boolean)
                       THEN now() END,
    available_at = now() + make_interval(secs => coalesce(
        CAST(:delay AS float8),
        least(CAST(:max_delay AS float8), CAST(:base_delay AS float8) * 2 ^ (attempts - 1)))),
    lease_until = NULL, last_error = :error
WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'claimed' AND claimed_by = :worker
RETURNING id, state, EXTRACT(EPOCH FROM available_at - now())::float8 AS due_in

-- name: record_skips
-- A record that got routed meanwhile (another path won the race) is not a skip.
INSERT INTO skipped_records AS s (org, crm_object, crm_id, reason, owner_found, source)
SELECT :org, :crm_object, t.crm_id, t.reason, t.owner_found, :source
FROM unnest(CAST(:crm_ids AS text[]), CAST(:reasons AS text[]), CAST(:owners AS text[]))
     AS t (crm_id, reason, owner_found)
WHERE NOT EXISTS (
    SELECT 1 FROM leads l
    WHERE l.org = :org AND l.crm_object = :crm_object AND l.crm_id = t.crm_id
      AND l.merged_into IS NULL)
ORDER BY t.crm_id
ON CONFLICT (org, crm_object, crm_id) DO UPDATE
SET reason = EXCLUDED.reason, owner_found = EXCLUDED.owner_found, source = EXCLUDED.source,
    times = s.times + 1, last_seen_at = now()

-- name: list
SELECT id, source, event_key, crm_id, state, attempts, last_error, received_at, finished_at
FROM intake_events
WHERE org = :org AND state = :state
ORDER BY id
LIMIT :limit

-- name: retry_dead
UPDATE intake_events
SET state = 'pending', attempts = 0, available_at = now(), finished_at = NULL,
    claimed_by = NULL, last_error = NULL
WHERE org = :org AND state = 'dead'
  AND (CAST(:ids AS bigint[]) IS NULL OR id = ANY(CAST(:ids AS bigint[])))
RETURNING id
