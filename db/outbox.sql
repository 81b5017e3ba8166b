-- Named SQL for the outbox dispatcher.
-- Claims run one at a time per org (claim_lock), each in its own short transaction, so the
-- "no other claim in flight for this parent" test in `claim` sees every committed claim.
-- CRM calls happen after the claim committed and before `finish_*`: never inside a
-- transaction. A finish only touches rows still claimed with the same token, so the late
-- result of a worker whose lease expired changes nothing.

-- name: claim_lock
SELECT pg_advisory_xact_lock(hashtext('lead-routing-connector:claim'), hashtext(:org))

-- name: rescue_expired
-- Claims whose lease expired are pending again (under their ids). Reads only the leases that
-- ended since :since, the previous rescue's now() in this dispatcher (NULL on a full claim:
-- all), so that with a snapshot held open it steps over the lease ends of that interval, not
-- over every version ever claimed since the snapshot began. Returns this rescue's now(). (A
-- claim that committed after that rescue with a lease already ended, possible only with a
-- lease shorter than its wait for claim_lock, is freed by the next full claim.)
WITH freed AS (
    UPDATE outbox SET state = 'pending', claimed_by = NULL, lease_until = NULL
    WHERE org = :org AND state = 'claimed' AND lease_until < now()
      AND lease_until >= coalesce(CAST(:since AS timestamptz), '-infinity')
    RETURNING id
)
SELECT now() AS at, coalesce(array_agg(id ORDER BY id), '{}') AS ids FROM freed

-- name: paused_until
SELECT until, reason FROM org_pauses WHERE org = :org AND until > now()

-- name: claim
-- Up to :limit ready rows from id :floor up, oldest first (connector/core/floor.py says why the
-- floor and how nothing below it is lost), skipping the rows of a parent with a claim in
-- flight. The claims in flight are read once per claim (a hashed set), by lease: a claim is
-- in flight until its lease expires (then its dispatcher has stopped sending:
-- decisions.lease_valid; rescue_expired makes its rows pending). Reading them by lease
-- reads only the claims of the last lease, while a snapshot held open (a long report, a
-- forgotten transaction) keeps every version ever claimed since in any index on claimed rows
-- (bench/snapshot.py: a probe per pending row through such an index once stalled the
-- dispatchers for over a minute a claim).
WITH in_flight AS (
    SELECT DISTINCT c.parent_id
    FROM outbox c
    WHERE c.org = :org AND c.state = 'claimed' AND c.lease_until >= now()
      AND c.parent_id IS NOT NULL
), ready AS (
    SELECT o.id
    FROM outbox o
    WHERE o.org = :org AND o.state = 'pending' AND o.id >= :floor AND o.available_at <= now()
      AND (o.parent_id IS NULL OR o.parent_id NOT IN (SELECT parent_id FROM in_flight))
    ORDER BY o.id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
SET state = 'claimed', claimed_by = :token, attempts = o.attempts + 1,
    lease_until = now() + make_interval(secs => :lease_seconds)
FROM ready
WHERE o.id = ready.id
RETURNING o.id, o.crm_id, o.owner_id, o.parent_id, o.attempts,
          extract(epoch FROM now() - o.created_at) AS age, o.replaces_owners

-- name: lowest_skipped
-- Asked in the claiming transaction, after the claim and any release: the lowest id still
-- pending from the claim's floor up to the highest id it took (a parent in flight, a retry
-- not yet due, a row given back, a row another transaction held locked), which the floor must
-- not pass.
SELECT min(id) AS id FROM outbox
WHERE org = :org AND state = 'pending' AND id >= :floor AND id <= :top

-- name: finish
-- One statement records a round's results: sent, dead (with the CRM's reason), superseded
-- (with the owner found) or back to pending after a delay (a retry).
UPDATE outbox o
SET state = f.state,
    finished_at = CASE WHEN f.state = 'pending' THEN NULL ELSE now() END,
    claimed_by = CASE WHEN f.state = 'pending' THEN NULL ELSE o.claimed_by END,
    lease_until = NULL,
    last_error = f.error,
    found_owner = f.owner,
    available_at = CASE WHEN f.state = 'pending'
                        THEN now() + make_interval(secs => f.delay) ELSE o.available_at END
FROM unnest(CAST(:ids AS bigint[]), CAST(:states AS text[]), CAST(:errors AS text[]),
            CAST(:delays AS float8[]), CAST(:owners AS text[]))
     AS f (id, state, error, delay, owner)
WHERE o.id = f.id AND o.state = 'claimed' AND o.claimed_by = :token
RETURNING o.id

-- name: pause_org
INSERT INTO org_pauses (org, until, reason)
VALUES (:org, now() + make_interval(secs => :seconds), :reason)
ON CONFLICT (org) DO UPDATE
SET until = GREATEST(org_pauses.until, EXCLUDED.until), reason = EXCLUDED.reason,
    updated_at = now()

-- name: next_due
-- (outbox_open_age: unfinished rows are the pending and claimed ones)
SELECT min(available_at) AS next_at, count(*) AS open
FROM outbox WHERE org = :org AND finished_at IS NULL AND state IN ('pending', 'claimed')

-- name: list_finished
SELECT id, lead_id, crm_object, crm_id, owner_id, found_owner, attempts, last_error, finished_at
FROM outbox
WHERE org = :org AND state = :state AND state <> 'claimed'  -- (the predicate of outbox_org_state_id)
ORDER BY id LIMIT :limit

-- name: retry_dead
UPDATE outbox
SET state = 'pending', attempts = 0, available_at = now(), finished_at = NULL,
    claimed_by = NULL
WHERE org = :org AND state = 'dead' AND (CAST(:ids AS bigint[]) IS NULL OR id = ANY(CAST(:ids AS bigint[])))
RETURNING id

-- name: renew
-- A claim's lease is extended before a CRM call once a quarter of it has gone (a claim of
-- several requests, a slow CRM), so that every call starts with at least three quarters of a
-- lease left. Only rows still claimed under this token whose lease has not ended: a row
-- missing from the answer was taken back (another dispatcher may hold it); the renewal is
-- then rolled back and the claim sends nothing more.
UPDATE outbox SET lease_until = now() + make_interval(secs => :lease_seconds)
WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'claimed' AND claimed_by = :token
  AND lease_until > now()
RETURNING id

-- name: renew_held
-- The LeaseKeeper's renewal of a claim's unfinished rows (connector/core/leases.py): one
-- autocommit statement, so a process frozen mid-renewal holds no row lock; how many rows
-- were still ours (fewer: some were taken back, and the claim stops).
WITH renewed AS (
    UPDATE outbox SET lease_until = now() + make_interval(secs => :lease_seconds)
    WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'claimed' AND claimed_by = :token
      AND lease_until > now()
    RETURNING id
)
SELECT count(*) AS n FROM renewed

-- name: release
-- Give back, in the claiming transaction, the rows of a partial last request the claim holds
-- back (decisions.hold_tail), so they fill a later claim's requests instead of going out in
-- a half-empty one; the attempt the claim counted is returned.
UPDATE outbox
SET state = 'pending', claimed_by = NULL, lease_until = NULL, attempts = attempts - 1
WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'claimed' AND claimed_by = :token

-- name: others_in_flight
-- Does another claim of the org hold rows (its requests in flight, or a dead worker's claim
-- until its lease expires)? Asked under claim_lock just before `claim`: every earlier claim
-- is visible, and no other claim can start until this one commits. By lease, as in `claim`.
SELECT EXISTS (
    SELECT 1 FROM outbox
    WHERE org = :org AND state = 'claimed' AND lease_until >= now() AND claimed_by <> :token
)

-- name: listen_ready
-- The channel of "an org has new owner writes": an inbox worker with no dispatchers in its
-- process (`connector serve`, `run --dispatchers 0`, the `uvicorn --factory` app) announces
-- each round that claimed events of an org, once the round is over (announce_ready; the
-- payload is the org; a round that failed announces too, costing an empty claim), and
-- `connector dispatch` processes listen, so
-- their dispatchers go at once instead of on their next cycle (connector/writeback/wakeups.py).
LISTEN lrc_outbox_ready

-- name: announce_ready
SELECT pg_notify('lrc_outbox_ready', :org)
