-- name: create_version_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: lock
-- Held by the session for the whole run, pauses between attempts included (see unlock).
SELECT pg_advisory_lock(hashtext('lead-routing-connector:migrate'))

-- name: unlock
SELECT pg_advisory_unlock(hashtext('lead-routing-connector:migrate'))

-- name: lock_timeout
-- A migration's wait for a table lock is bounded (migrate retries it): while it waits, every
-- statement that needs that table queues behind it.
SELECT set_config('lock_timeout', :lock_timeout, true)

-- name: applied
SELECT version FROM schema_migrations ORDER BY version

-- name: record
INSERT INTO schema_migrations (version, name) VALUES (:version, :name)

-- name: vacuum_settings
-- What the queue tables and the planner's statistics depend on (store.vacuum_warning).
SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'track_counts')
