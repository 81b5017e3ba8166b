-- 0023_route_plain_one_sort.sql
-- route_plain (0021, 0022), the same decisions and records, with less work under the team's
-- lock:
-- * The four arrays of the decision's seats come from one sort of the seats, not four (each
--   array_agg(... ORDER BY ...) sorts its own input before PostgreSQL 16).
-- * A team retired while the lead waited (the lock finds no row) skips the second statement:
--   the lead row is deleted at once.
-- The checks before the lock (an active member, nobody of the team away by command) stay:
-- without them a lead of a team with a rep away would wait for the lock twice, once here
-- and once in route_lead, for as long as the time off lasts. Measured with pgbench
-- (-M prepared, 16 clients, 5 s runs alternating with the others, the server on 127.0.0.1,
-- fsync on), calls a second, median of five, two scratch builds that differed only in the
-- sort: four sorts 953, one 973, bench/ceiling.sql's two-statement ceiling 1,054. With
-- bench.assign (--only ceiling_fn:16:3000 project:16:3000, six alternating pairs against
-- 0022): project / ceiling 0.854 before, 0.873 after.
CREATE OR REPLACE FUNCTION route_plain(
    p_org text, p_crm_object text, p_source text, p_crm_id text, p_fields jsonb,
    p_parent_id text, p_team text, p_rule_index integer, p_rule_name text,
    p_now timestamptz, p_day date, p_week date, p_detail jsonb, p_sla_minutes integer
)
RETURNS TABLE (
    status text, lead_id bigint, team text, owner_id text, owner_name text, reason text,
    cand_ids bigint[], cand_skips text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    l record;
    r record;
    -- the decision as it will be stored when this call decides: the caller's part (the rules,
    -- the values, the instant), with the team, the outcome and the SLA; built here, before
    -- the team's lock is taken (the pick's part goes in columns, see below)
    v_detail jsonb := p_detail
        || jsonb_build_object('team', p_team, 'outcome', 'assigned')
        || CASE WHEN p_sla_minutes IS NULL THEN CAST('{}' AS jsonb)
                ELSE jsonb_build_object('sla_minutes', p_sla_minutes) END;
BEGIN
    team := p_team;
    status := 'route_lead';
    WITH snap AS (
        SELECT t.id FROM teams t
        WHERE t.org = p_org AND t.name = p_team AND t.in_config
          -- an active member (route_lead records a lead of a team without one unassigned)
          AND EXISTS (SELECT FROM members am
                      WHERE am.team_id = t.id AND am.active AND am.in_config)
          -- no rep of the team away by command at p_now (read from the org's time off,
          -- which is usually empty, not from the team's members)
          AND NOT EXISTS (
              SELECT FROM rep_time_off o
              WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until
                AND EXISTS (SELECT FROM members mb
                            WHERE mb.team_id = t.id AND mb.crm_user_id = o.crm_user_id
                              AND mb.in_config))
    ), lead AS (
        INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
        SELECT p_org, p_crm_object, p_crm_id, p_fields, p_parent_id, p_source FROM snap
        ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING
        RETURNING id, received_at
    ), locked AS (
        -- in_config is checked again on the row's newest version: a team a config apply
        -- retired while the lead waited is not locked
        SELECT t.id, t.epoch FROM teams t
        WHERE t.id = (SELECT snap.id FROM snap) AND t.in_config AND EXISTS (SELECT FROM lead)
        FOR UPDATE
    )
    SELECT lead.id, lead.received_at, locked.id AS team_id, locked.epoch
    FROM lead LEFT JOIN locked ON true
    INTO l;
    IF l.id IS NULL THEN  -- nothing written (a repeat, or no such team)
        RETURN NEXT;
        RETURN;
    END IF;
    IF l.team_id IS NULL THEN  -- the team was retired while the lead waited (not locked)
        DELETE FROM leads WHERE id = l.id;
        RETURN NEXT;
        RETURN;
    END IF;
    -- A new statement: a fresh snapshot, taken with the team's lock held.
    WITH seat AS (
        SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch AS turns, m.position,
               m.active, m.crm_user_id, m.name
        FROM members m
        WHERE m.team_id = l.team_id AND m.in_config
    ), seats AS (
        -- the rotation's totals over the active seats, and every member as the decision
        -- records it: the active seats in rotation order, then the inactive ones. One sort
        -- feeds the four arrays: they read the rows of a sorted subquery, with nothing at
        -- this level (no join, no grouping) to reorder them, as PostgreSQL's manual says
        -- "will usually work" (non-standard SQL; a subquery with ORDER BY is never pulled
        -- up, and the sort ends on the id, so it is total); four array_agg(... ORDER BY ...)
        -- would sort four times before PostgreSQL 16. test_route_lead checks the order.
        SELECT CAST(sum(o.weight) FILTER (WHERE o.active) AS bigint) AS w,
               CAST(sum(o.turns) FILTER (WHERE o.active) AS bigint) AS slot,
               array_agg(o.id) AS ids, array_agg(o.skip) AS skips,
               array_agg(o.weight) AS weights, array_agg(o.turns) AS turns
        FROM (SELECT s.id, s.weight, s.turns, s.active,
                     CASE WHEN NOT s.active THEN 'inactive' END AS skip
              FROM seat s
              ORDER BY NOT s.active, CASE WHEN s.active THEN -s.weight END, s.position,
                       s.id) o
    ), chosen AS (
        SELECT s.id, s.crm_user_id, s.name
        FROM seat s, seats
        WHERE s.active
          -- a rep of the team away by command now (read under the lock, so time off stored
          -- while the lead waited counts): route_lead decides the lead
          AND NOT EXISTS (
              SELECT FROM rep_time_off o JOIN seat mb ON mb.crm_user_id = o.crm_user_id
              WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until)
        ORDER BY s.turns * seats.w / s.weight > seats.slot,
                 ((s.turns + 1) * seats.w + s.weight - 1) / s.weight,
                 s.weight DESC, s.position, s.id
        LIMIT 1
    ), bump AS (
        UPDATE members mb SET assigned_in_epoch = mb.assigned_in_epoch + 1
        FROM chosen WHERE mb.id = chosen.id
        RETURNING mb.id
    ), load AS (
        INSERT INTO member_load (member_id, period, starts_on, assigned)
        SELECT chosen.id, k.period, k.starts_on, 1
        FROM chosen
        CROSS JOIN (VALUES ('day', p_day), ('week', p_week)) AS k (period, starts_on)
        ON CONFLICT (member_id, period, starts_on)
        DO UPDATE SET assigned = member_load.assigned + 1
        RETURNING member_id
    ), assigned AS (
        INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at)
        SELECT l.id, p_org, l.team_id, chosen.id, chosen.crm_user_id, l.epoch,
               p_rule_index, p_rule_name, p_source,
               now() + make_interval(mins => p_sla_minutes)
        FROM chosen
        RETURNING id
    ), queued AS (
        INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                            lead_received_at)
        SELECT p_org, l.id, assigned.id, p_crm_object, p_crm_id, chosen.crm_user_id,
               p_parent_id, l.received_at
        FROM assigned, chosen
        RETURNING id
    ), decided AS (
        -- the decision built before the lock (v_detail), and what the pick adds in columns
        -- of their own: no JSON is built while the team's lock is held (decision_details
        -- shows the row as one detail)
        INSERT INTO routing_decisions (org, lead_id, kind, detail, batch, epoch, chosen_id,
                                       seat_ids, seat_weights, seat_counts, seat_skips)
        SELECT p_org, l.id, 'route', v_detail, l.id, l.epoch, chosen.id,
               seats.ids, seats.weights, seats.turns, seats.skips
        FROM chosen, seats
        RETURNING lead_id
    )
    SELECT chosen.crm_user_id AS owner_id, chosen.name AS owner_name, seats.ids, seats.skips,
           (SELECT count(*) FROM decided) AS decided
    FROM chosen, seats
    INTO r;
    IF r.decided IS DISTINCT FROM 1 THEN
        -- nothing but the lead was written (a rep of the team went away by command or it
        -- lost its last active member while the lead waited): take the lead back,
        -- route_lead decides it
        DELETE FROM leads WHERE id = l.id;
        RETURN NEXT;
        RETURN;
    END IF;
    status := 'assigned';
    lead_id := l.id;
    owner_id := r.owner_id;
    owner_name := r.owner_name;
    cand_ids := r.ids;
    cand_skips := r.skips;
    RETURN NEXT;
END
$$;
