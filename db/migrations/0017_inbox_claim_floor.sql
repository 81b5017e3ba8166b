-- 0017_inbox_claim_floor.sql
-- The inbox claim reads pending events in id order from a floor id up
-- (connector/intake/floor.py): under a snapshot held open, an index in id order lets it start
-- past the entries of every event claimed since, which no vacuum can remove meanwhile.
-- Expired claims are freed by their own statement (rescue_expired) on a full claim, so the
-- claim no longer reads intake_events_claimed either. The new index replaces the one
-- ordered by available_at, which only the old claim used. It indexes pending events only,
-- but building it reads the whole table once and holds back webhook inserts meanwhile
-- (seconds for millions of finished events): migrate between bursts.
DROP INDEX intake_events_pending;
CREATE INDEX intake_events_pending ON intake_events (org, id) WHERE state = 'pending';
