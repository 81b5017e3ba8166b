-- A team's seats as the routing reads them (db/functions/: applied on every migrate, see
-- connector/shell/migrations.py apply_functions).

-- team_seats: team_candidates' query (db/routing.sql) as a STABLE SQL function the planner
-- inlines (reassignment reads it under the team lock).
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
