-- 0024_lock_team_seats.sql
-- A batch takes its team's lock and reads the team's seats in ONE round trip. Router's batch
-- path sent lock_team, waited for the lock, then sent team_candidates (db/routing.sql):
-- two round trips while the team was locked, and at 16 workers each one also waited for
-- its client to be scheduled again on two busy cores. lock_team_seats is both in one call:
-- the first statement locks the team row, the second (a new statement of a VOLATILE
-- function, so its snapshot is taken under the lock) reads team_candidates' rows, with the
-- team's id and epoch on each. No row when the team is not in the database; one row with
-- the member columns NULL when it has no configured member. The day and the week are the
-- caller's, from before the lock (Router passes its previous batch's, so that its clock is
-- still read once a batch, under the locks): Router checks them against that time once the
-- call has returned and reads the seats again (team_candidates) when it falls on another
-- day or week. Measured with bench.assign --only ceiling_batch:16:40000:500
-- project_batch:16:40000:500, 13 alternating pairs against the tree before: ratio median
-- 0.868 -> 0.881.
-- team_seats is team_candidates' query (db/routing.sql), now in one place: a STABLE SQL
-- function of one SELECT, which the planner inlines into the statement that calls it, so it
-- reads with that statement's snapshot and costs nothing over the query written out.
-- team_candidates and lock_team_seats both call it.
CREATE FUNCTION team_seats(p_org text, p_team_id bigint, p_day date, p_week date)
RETURNS TABLE (
    id bigint, weight integer, turns bigint, "position" integer, crm_user_id text, name text,
    active boolean, away_from timestamptz, away_until timestamptz, day_count integer,
    week_count integer
)
LANGUAGE sql STABLE
AS $$
    SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch, m.position,
           m.crm_user_id, m.name, m.active, o.starts_at, o.until,
           coalesce(d.assigned, 0), coalesce(w.assigned, 0)
    FROM members m
    LEFT JOIN rep_time_off o ON o.org = p_org AND o.crm_user_id = m.crm_user_id
    LEFT JOIN member_load d ON d.member_id = m.id AND d.period = 'day' AND d.starts_on = p_day
    LEFT JOIN member_load w
           ON w.member_id = m.id AND w.period = 'week' AND w.starts_on = p_week
    WHERE m.team_id = p_team_id AND m.in_config
$$;

CREATE FUNCTION lock_team_seats(p_org text, p_team text, p_day date, p_week date)
RETURNS TABLE (
    team_id bigint, epoch integer, id bigint, weight integer, turns bigint, "position" integer,
    crm_user_id text, name text, active boolean, away_from timestamptz, away_until timestamptz,
    day_count integer, week_count integer
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    t record;
BEGIN
    SELECT tm.id, tm.epoch FROM teams tm
    WHERE tm.org = p_org AND tm.name = p_team AND tm.in_config
    FOR UPDATE
    INTO t;
    IF t.id IS NULL THEN  -- no such team in the database: no row
        RETURN;
    END IF;
    -- A new statement: a fresh snapshot, taken with the team's lock held.
    RETURN QUERY
    SELECT t.id, t.epoch, s.id, s.weight, s.turns, s.position, s.crm_user_id, s.name, s.active,
           s.away_from, s.away_until, s.day_count, s.week_count
    FROM team_seats(p_org, t.id, p_day, p_week) s
    ORDER BY s.position;
    IF NOT FOUND THEN  -- no configured member: the lock's row alone
        team_id := t.id;
        epoch := t.epoch;
        RETURN NEXT;
    END IF;
END
$$;
