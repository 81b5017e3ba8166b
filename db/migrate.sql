-- name: create_version_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: create_functions_table
-- The digest of the db/functions/ files the functions step last applied (one row), so that a
-- process that does not migrate can tell that the server code is behind its files.
CREATE TABLE IF NOT EXISTS schema_functions (
    digest     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: functions_digest
SELECT digest FROM schema_functions

-- name: clear_functions_digest
DELETE FROM schema_functions

-- name: record_functions_digest
INSERT INTO schema_functions (digest) VALUES (:digest)

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

-- name: tidy_baseline
-- A database migrated before the baseline recorded each version up to it; the baseline's row
-- stands for them all.
DELETE FROM schema_migrations WHERE version < :baseline

-- name: name_baseline
UPDATE schema_migrations SET name = :name WHERE version = :baseline AND name <> :name

-- name: obsolete_server_code
-- The functions, views and triggers of the connector's schema that the running transaction
-- did not write: every CREATE OR REPLACE of db/functions/ rewrites its catalog row (pg_proc,
-- pg_class, pg_trigger), so that row's xmin is this transaction's id, and a row with another
-- xmin is of an object the files no longer define. Members of an extension, and functions
-- another object requires (a type's), are not the files' to drop. One DROP per row, triggers
-- first, then views, then functions; no CASCADE, so an object still in use by one the files
-- define stops the migrate instead of vanishing with it.
SELECT statement FROM (
    SELECT 1 AS step, format('DROP TRIGGER %I ON %s', t.tgname, CAST(t.tgrelid AS regclass))
           AS statement
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = CAST(current_schema() AS regnamespace) AND NOT t.tgisinternal
      AND t.xmin <> CAST(pg_current_xact_id() AS xid)
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = CAST('pg_class' AS regclass)
                      AND d.objid = c.oid AND d.deptype = 'e')
    UNION ALL
    SELECT 2, format('DROP VIEW %s', CAST(c.oid AS regclass))
    FROM pg_class c
    WHERE c.relnamespace = CAST(current_schema() AS regnamespace) AND c.relkind = 'v'
      AND c.xmin <> CAST(pg_current_xact_id() AS xid)
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = CAST('pg_class' AS regclass)
                      AND d.objid = c.oid AND d.deptype = 'e')
    UNION ALL
    SELECT 3, format('DROP %s %s',
                     CASE p.prokind WHEN 'a' THEN 'AGGREGATE' WHEN 'p' THEN 'PROCEDURE'
                                    ELSE 'FUNCTION' END,
                     CAST(p.oid AS regprocedure))
    FROM pg_proc p
    WHERE p.pronamespace = CAST(current_schema() AS regnamespace)
      AND p.xmin <> CAST(pg_current_xact_id() AS xid)
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = CAST('pg_proc' AS regclass)
                      AND d.objid = p.oid AND d.deptype IN ('e', 'i'))
) AS obsolete
ORDER BY step, statement
