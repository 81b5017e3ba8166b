-- A team's seats as the routing reads them (db/functions/: applied on every migrate, see
-- connector/shell/store.py apply_functions).

-- team_seats: team_candidates' query (db/routing.sql) as a STABLE SQL function the planner
-- inlines. lock_team_seats: a batch's team lock and the team's seats in one call; the second
-- statement's snapshot is taken under the lock. No row: no such team; one row with the
-- member columns NULL: no configured member.
CREATE OR REPLACE FUNCTION team_seats(p_org text, p_team_id bigint, p_day date, p_week date)
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

CREATE OR REPLACE FUNCTION lock_team_seats(p_org text, p_team text, p_day date, p_week date)
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
