-- 0020_route_plain.sql
-- A PLAIN team's new lead (no caps, no catch-up, nobody blocked by the config at the call's
-- now: connector/routing/single.py plain_call) is decided and recorded by ONE statement,
-- with route_lead's records: route_lead runs six statements, each with its own executor
-- start and finish, and reads the members with a fresh snapshot after the lock; this one
-- statement reads them through row locks instead, and picks with rotation_pick_plain
-- (migration 0019; inlined by the planner). The statement sits in a function so that
-- the client sends a short call (the driver re-parses a statement text over 4 KB on every
-- call) and so that its writes can be undone when it must not decide (below).
--
-- Why one statement is correct: at READ COMMITTED its snapshot is taken before it waits for
-- the team lock, and what it reads of the rotation it reads through row locks, which re-read
-- a row updated since the snapshot at its newest version: the team row (FOR UPDATE) and the
-- team's members (FOR SHARE; a rotation's counts move only under the team lock, so they are
-- the previous lock holder's). Not FOR KEY SHARE: that lock takes a row whose update left
-- its key alone as the snapshot saw it, stale counts and all (bench.assign at 16 workers
-- gave a spread of 2 with it). Whoever changes a member without the team lock must take the
-- team lock first (connector rep deactivate does), or the two could deadlock. A member the
-- snapshot cannot see at all (a config apply added it while the lead waited) is caught by
-- the team row's version: an apply (and `connector rep away`) always writes the team row.
-- When the team row changed since the snapshot, or the team has no active member (route_lead
-- records that lead as unassigned), the statement's writes are undone (an exception block:
-- a subtransaction, rolled back, its locks with it; no measurable time per call, but a call
-- that writes uses a second transaction id) and the call answers status 'route_lead', as it does
-- when the statement wrote nothing (a repeat, a rep of the team away by command at p_now, a
-- team not in the database). The caller then calls route_lead, whose statements take fresh
-- snapshots: in the same transaction, or in autocommit as a statement of its own.
-- Otherwise status 'assigned' and the columns route_lead returns.
CREATE FUNCTION route_plain(
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
    r record;
    v_lead bigint;
BEGIN
    BEGIN
        WITH snap AS (
            SELECT t.id, t.xmin AS version FROM teams t
            WHERE t.org = p_org AND t.name = p_team AND t.in_config
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
            SELECT t.id, t.epoch, t.xmin AS version FROM teams t
            WHERE t.id = (SELECT snap.id FROM snap) AND t.in_config AND EXISTS (SELECT FROM lead)
            FOR UPDATE
        ), seat AS (
            SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch AS turns, m.position,
                   m.active, m.crm_user_id, m.name
            FROM locked JOIN members m ON m.team_id = locked.id
            WHERE m.in_config
            FOR SHARE OF m
        ), pick AS (
            -- rotation_pick_plain (migration 0019) over the active seats
            SELECT p.member_id, p.cand_ids, p.cand_skips, p.cand_weights, p.cand_turns
            FROM (
                SELECT coalesce(array_agg(s.id) FILTER (WHERE s.active), '{}') AS ids,
                       coalesce(array_agg(s.weight) FILTER (WHERE s.active), '{}') AS weights,
                       coalesce(array_agg(s.turns) FILTER (WHERE s.active), '{}') AS turns,
                       coalesce(array_agg(s.position) FILTER (WHERE s.active), '{}') AS positions
                FROM seat s
            ) a
            CROSS JOIN LATERAL rotation_pick_plain(a.ids, a.weights, a.turns, a.positions) p
        ), chosen AS (
            SELECT s.id, s.crm_user_id, s.name FROM seat s JOIN pick ON s.id = pick.member_id
        ), seats AS (
            -- as route_lead records them: the rotation's seats in its order, then the inactive
            -- members by position
            SELECT pick.cand_ids || coalesce(i.ids, '{}') AS ids,
                   pick.cand_skips || coalesce(i.skips, '{}') AS skips,
                   pick.cand_weights || coalesce(i.weights, '{}') AS weights,
                   pick.cand_turns || coalesce(i.turns, '{}') AS turns
            FROM pick, (
                SELECT array_agg(s.id ORDER BY s.position) AS ids,
                       array_agg(CAST('inactive' AS text) ORDER BY s.position) AS skips,
                       array_agg(s.weight ORDER BY s.position) AS weights,
                       array_agg(s.turns ORDER BY s.position) AS turns
                FROM seat s WHERE NOT s.active
            ) i
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
            SELECT lead.id, p_org, locked.id, chosen.id, chosen.crm_user_id, locked.epoch,
                   p_rule_index, p_rule_name, p_source,
                   now() + make_interval(mins => p_sla_minutes)
            FROM lead, locked, chosen
            RETURNING id
        ), queued AS (
            INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                                lead_received_at)
            SELECT p_org, lead.id, assigned.id, p_crm_object, p_crm_id, chosen.crm_user_id,
                   p_parent_id, lead.received_at
            FROM assigned, lead, chosen
            RETURNING id
        ), decided AS (
            INSERT INTO routing_decisions (org, lead_id, kind, detail)
            SELECT p_org, lead.id, 'route',
                   p_detail
                   || jsonb_build_object(
                          'batch', lead.id, 'team', p_team,
                          'seats', jsonb_build_object('ids', seats.ids, 'weights', seats.weights,
                                                      'counts', seats.turns, 'skips', seats.skips),
                          'epoch', locked.epoch, 'outcome', 'assigned', 'chosen_id', chosen.id)
                   || CASE WHEN p_sla_minutes IS NULL THEN CAST('{}' AS jsonb)
                           ELSE jsonb_build_object('sla_minutes', p_sla_minutes) END
            FROM lead, locked, chosen, seats
            RETURNING lead_id
        )
        SELECT (SELECT lead.id FROM lead) AS lead_id,
               (SELECT locked.version FROM locked)
                   IS NOT DISTINCT FROM (SELECT snap.version FROM snap) AS same_team,
               (SELECT count(*) FROM decided) AS decided,
               (SELECT chosen.crm_user_id FROM chosen) AS owner_id,
               (SELECT chosen.name FROM chosen) AS owner_name,
               (SELECT seats.ids FROM seats) AS ids, (SELECT seats.skips FROM seats) AS skips
        INTO r;
        v_lead := r.lead_id;
        IF v_lead IS NOT NULL AND NOT (r.same_team AND r.decided = 1) THEN
            -- the team changed while the lead waited for its lock, or has no active member
            RAISE EXCEPTION USING ERRCODE = 'LR001', MESSAGE = 'route_plain: take route_lead';
        END IF;
    EXCEPTION WHEN SQLSTATE 'LR001' THEN
        v_lead := NULL;  -- every write of the statement is undone
    END;
    team := p_team;
    IF v_lead IS NULL THEN
        status := 'route_lead';
    ELSE
        status := 'assigned';
        lead_id := v_lead;
        owner_id := r.owner_id;
        owner_name := r.owner_name;
        cand_ids := r.ids;
        cand_skips := r.skips;
    END IF;
    RETURN NEXT;
END
$$;
