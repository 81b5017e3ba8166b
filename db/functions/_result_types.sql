-- The row types the server functions return (db/functions/: applied first on every migrate,
-- this file's name sorts before the others). A function returning a named composite type
-- gets its row type from the type cache; one with OUT parameters would rebuild it from its
-- pg_proc row on every call, which the single-lead call (route_new_lead, then route_team and
-- rotation_picks) pays three times a lead.
--
-- CREATE TYPE has no OR REPLACE: a type is made when missing, and a type whose columns are no
-- longer those below is dropped first, with the functions that return it (CASCADE; the files
-- after this one make them again in the same transaction). The same functions in their form
-- with OUT parameters (result type record) are dropped too: CREATE OR REPLACE cannot change a
-- function's result type.
DO $$
DECLARE
    t record;
    f regprocedure;
BEGIN
    FOR t IN
        SELECT * FROM (VALUES
            ('rotation_picks_result',
             'picks bigint[], skips text[], counts bigint[], credit_ids bigint[], '
             'credit_ns bigint[]'),
            ('route_team_result',
             'status text, epoch integer, member_ids bigint[], reason text, seat_ids bigint[], '
             'seat_users text[], seat_names text[], seat_weights integer[], seat_skips text[], '
             'seat_counts bigint[], away_by_command text[], credit_ids bigint[], '
             'credit_ns bigint[]'),
            ('route_new_lead_result',
             'status text, lead_id bigint, team text, owner_id text, owner_name text, '
             'reason text, member_ids bigint[], seat_ids bigint[], seat_skips text[]')
        ) AS v (name, columns)
    LOOP
        IF to_regtype(t.name) IS NOT NULL
           AND (SELECT string_agg(format('%s %s', a.attname, format_type(a.atttypid,
                                                                         a.atttypmod)),
                                  ', ' ORDER BY a.attnum)
                FROM pg_type ty JOIN pg_attribute a ON a.attrelid = ty.typrelid
                WHERE ty.oid = to_regtype(t.name) AND a.attnum > 0 AND NOT a.attisdropped)
               IS DISTINCT FROM t.columns THEN
            EXECUTE format('DROP TYPE %I CASCADE', t.name);
        END IF;
        IF to_regtype(t.name) IS NULL THEN
            EXECUTE format('CREATE TYPE %I AS (%s)', t.name, t.columns);
        END IF;
    END LOOP;
    FOR f IN
        SELECT p.oid FROM pg_proc p
        WHERE p.pronamespace = CAST(current_schema() AS regnamespace)
          AND p.proname IN ('rotation_picks', 'route_team', 'route_new_lead')
          AND p.prorettype = CAST('record' AS regtype)
    LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
END
$$;
