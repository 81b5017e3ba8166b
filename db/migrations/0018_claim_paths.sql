-- 0018_claim_paths.sql
-- Paths of the queue statements that stay short while a snapshot is held open (a long report,
-- a forgotten transaction): no vacuum can then remove a row version the queues leave behind,
-- nor its index entries, so any statement that reads "every claimed row" or "every pending
-- row" from the start of an index reads every version since the snapshot began.
--
-- * The outbox claim reads pending rows in id order from a floor id up, as the inbox claim
--   does since 0017 (connector/core/floor.py): it starts past the entries of every row
--   claimed since.
-- * Claims in flight are read by lease (the claim's parents in flight, others_in_flight,
--   rescue_expired): an index of the rows that hold a lease, by org and lease end. A live
--   claim's lease has not expired, so the claim reads only the last lease's claims.
-- * The finish statements look their rows up by primary key. Any index that state =
--   'claimed' could read let the planner read all of it instead, every dead version in it:
--   a hash of the partial index on claimed rows (59 ms a finish after 3 minutes of a held
--   snapshot, growing), or a skip scan of outbox_org_state_id for that state (305 ms after
--   7 minutes; the claims' others_in_flight read the same range, 185 ms). So no index now
--   holds claimed rows by state: outbox_org_state_id leaves them out, and the leased and
--   unfinished rows are indexed by predicates on lease_until and finished_at, which those
--   statements do not test. Statements that count claimed rows ask for the lease too.
--   (Claimed rows are exactly the leased ones, and unfinished rows the pending and claimed
--   ones; every statement still tests the state, so an index is only a path.)
--
-- The migration runs in one transaction, and DROP INDEX locks its table until it commits:
-- every read and write of outbox and intake_events (claims, finishes, the receivers' inserts,
-- the dashboard) waits while the new indexes are built, each reading its table once
-- (seconds for millions of rows). Migrate between bursts.
DROP INDEX outbox_pending;
CREATE INDEX outbox_pending ON outbox (org, id) WHERE state = 'pending';
DROP INDEX outbox_claimed;
DROP INDEX outbox_claimed_parent;
CREATE INDEX outbox_leased ON outbox (org, lease_until) WHERE lease_until IS NOT NULL;
DROP INDEX outbox_open_age;
CREATE INDEX outbox_open_age ON outbox (org, created_at) WHERE finished_at IS NULL;
DROP INDEX intake_events_claimed;
CREATE INDEX intake_events_leased ON intake_events (org, lease_until) WHERE lease_until IS NOT NULL;
DROP INDEX outbox_org_state_id;
CREATE INDEX outbox_org_state_id ON outbox (org, state, id) WHERE state <> 'claimed';
