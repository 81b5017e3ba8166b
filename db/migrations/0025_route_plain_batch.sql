-- 0025_route_plain_batch.sql
-- A batch of one plain team, decided and recorded in ONE call once its leads are inserted.
-- Router's batch path held the team's lock for three round trips (lock_team_seats,
-- record_assignments, COMMIT) and for the Python between the first two (the picks and the
-- decisions' seats, 1.4 ms for 500 leads); at 16 workers on two busy cores each of those
-- round trips also waited for the holder's client to be scheduled again. route_plain_batch
-- takes the lock and does the rest on the server: the lock is held for this call and the
-- COMMIT.
-- It decides a batch only when every lead goes to one team whose active reps all have the
-- same weight, with no caps and no catch-up, nobody blocked by the config at p_now (the
-- caller checks those before the call, as for route_plain) and nobody of the team away by
-- command at p_now (checked here, under the lock). Then the picks are plain round robin
-- (connector/routing/rotation.py _round_robin, which proves it): every active seat's next
-- turns, ordered by (turns before, rank), rank being (position, id) among equal weights.
-- Otherwise it writes nothing and answers 'general': the caller's general path decides the
-- batch in the same transaction. The checks are made before the lock too, so a team this
-- call does not decide is not locked by it (a rep away by command for days costs each batch
-- one round trip before the lock, not a second wait for it); when they fail only under the
-- lock, the lock stays held. The records are record_assignments' (db/routing.sql), field
-- for field: tests/test_plain_batch.py compares the two paths' outcomes, decisions,
-- counts, caps counters, assignments and outbox rows.
-- Each decision's seat counts are every candidate's turns before its pick: for the pick at
-- (level t, rank r) an active seat of rank i with d turns has had greatest(d, t + (i < r))
-- (its turns at levels d .. t-1, and at level t when it comes first in rank); an inactive
-- seat keeps its turns.
CREATE FUNCTION route_plain_batch(
    p_org text, p_crm_object text, p_source text, p_team text, p_now timestamptz,
    p_day date, p_week date, p_batch bigint, p_lead_ids bigint[], p_crm_ids text[],
    p_parent_ids text[], p_rule_indexes integer[], p_rule_names text[],
    p_sla_minutes integer[], p_detail_of integer[], p_details jsonb
)
RETURNS TABLE (
    status text, epoch integer, member_ids bigint[], seat_ids bigint[], seat_skips text[],
    seat_users text[], seat_names text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    t record;
    r record;
    v_n integer := cardinality(p_lead_ids);
BEGIN
    status := 'general';
    IF v_n IS NULL OR v_n = 0 THEN  -- no lead: nothing to decide
        RETURN NEXT;
        RETURN;
    END IF;
    -- The checks are made first with the snapshot from before the lock, so that this call
    -- does not wait for the lock of a team it will not decide (a rep away by command for
    -- days, say), which the general path then waits for; they are made again under the lock.
    SELECT tm.id, tm.epoch FROM teams tm
    WHERE tm.org = p_org AND tm.name = p_team AND tm.in_config
      AND (SELECT count(*) > 0 AND min(am.weight) = max(am.weight) FROM members am
           WHERE am.team_id = tm.id AND am.active AND am.in_config)
      AND NOT EXISTS (
          SELECT FROM rep_time_off o JOIN members mb ON mb.crm_user_id = o.crm_user_id
          WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until
            AND mb.team_id = tm.id AND mb.in_config)
    FOR UPDATE
    INTO t;
    IF t.id IS NULL THEN
        -- not locked: no such team (the general path says so), or one this call does not
        -- decide
        RETURN NEXT;
        RETURN;
    END IF;
    epoch := t.epoch;
    -- A new statement: a fresh snapshot, taken with the team's lock held.
    WITH seat AS (
        SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch AS turns, m.position,
               m.active, m.crm_user_id, m.name
        FROM members m
        WHERE m.team_id = t.id AND m.in_config
    ), ok AS (
        -- one row when this call decides the batch: an active member, equal weights, nobody
        -- of the team away by command at p_now
        SELECT CAST(count(*) AS integer) AS k, max(s.turns) AS top
        FROM seat s
        WHERE s.active
        HAVING count(*) > 0 AND min(s.weight) = max(s.weight)
           AND NOT EXISTS (
               SELECT FROM rep_time_off o JOIN seat mb ON mb.crm_user_id = o.crm_user_id
               WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until)
    ), seats AS (
        -- every member as the decisions record it: the active seats in rank order, then the
        -- inactive ones; one sort feeds the arrays (as in route_plain, migration 0023)
        SELECT array_agg(o.id) AS ids, array_agg(o.skip) AS skips, array_agg(o.weight) AS weights,
               array_agg(o.turns) AS turns, array_agg(o.crm_user_id) AS users,
               array_agg(o.name) AS names, count(*) AS len
        FROM (SELECT s.id, s.weight, s.turns, s.crm_user_id, s.name,
                     CASE WHEN NOT s.active THEN 'inactive' END AS skip
              FROM seat s
              ORDER BY NOT s.active, s.position, s.id) o
    ), ranked AS (
        SELECT s.id, s.turns, s.crm_user_id,
               CAST(row_number() OVER (ORDER BY s.position, s.id) AS integer) AS rk
        FROM seat s
        WHERE s.active
    ), turn AS (
        -- each active seat's next turns, far enough for v_n picks: from level top on, every
        -- level gives k picks, and no seat takes more than v_n
        SELECT a.id, a.crm_user_id, a.rk, g.t
        FROM ok, ranked a,
             generate_series(a.turns, least(a.turns + v_n, ok.top + (v_n + ok.k - 1) / ok.k) - 1)
                 AS g (t)
    ), pick AS (
        SELECT u.id AS member_id, u.crm_user_id, u.rk, u.t,
               row_number() OVER (ORDER BY u.t, u.rk) AS ord
        FROM turn u
        ORDER BY u.t, u.rk
        LIMIT v_n
    ), picks AS (
        SELECT p.*, k.member_id, k.crm_user_id, k.rk, k.t
        FROM ROWS FROM (unnest(p_lead_ids), unnest(p_crm_ids), unnest(p_parent_ids),
                        unnest(p_rule_indexes), unnest(p_rule_names), unnest(p_sla_minutes),
                        unnest(p_detail_of))
             WITH ORDINALITY AS p (lead_id, crm_id, parent_id, rule_index, rule_name,
                                   sla_minutes, detail_of, ord)
        JOIN pick k ON k.ord = p.ord
    ), per_member AS (
        SELECT member_id, count(*) AS n FROM picks GROUP BY member_id
    ), bump AS (
        UPDATE members m SET assigned_in_epoch = m.assigned_in_epoch + pm.n
        FROM per_member pm WHERE m.id = pm.member_id
        RETURNING m.id
    ), load AS (
        INSERT INTO member_load (member_id, period, starts_on, assigned)
        SELECT pm.member_id, k.period, k.starts_on, pm.n
        FROM per_member pm
        CROSS JOIN (VALUES ('day', p_day), ('week', p_week)) AS k (period, starts_on)
        ON CONFLICT (member_id, period, starts_on)
        DO UPDATE SET assigned = member_load.assigned + EXCLUDED.assigned
        RETURNING member_id
    ), assigned AS (
        -- assignment ids follow the picks' order (connector simulate replays by them)
        INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at)
        SELECT p.lead_id, p_org, t.id, p.member_id, p.crm_user_id, t.epoch, p.rule_index,
               p.rule_name, p_source, now() + make_interval(mins => p.sla_minutes)
        FROM picks p
        ORDER BY p.ord
        RETURNING id, lead_id, crm_user_id
    ), decided AS (
        INSERT INTO routing_decisions (org, lead_id, kind, detail, batch, epoch, chosen_id,
                                       seat_ids, seat_weights, seat_counts, seat_skips)
        SELECT p_org, p.lead_id, 'route', p_details -> p.detail_of, p_batch, t.epoch,
               p.member_id, x.ids, x.weights,
               CASE WHEN p.t >= ok.top
                    -- every seat has reached level t: the seats before the pick's have had
                    -- their turn at it, the others not yet (then the inactive seats)
                    THEN array_fill(p.t + 1, ARRAY[p.rk - 1]) || array_fill(p.t, ARRAY[ok.k - p.rk + 1])
                         || x.turns[ok.k + 1:]
                    ELSE ARRAY(SELECT CASE WHEN i <= ok.k
                                           THEN greatest(x.turns[i],
                                                         p.t + CASE WHEN i < p.rk THEN 1 ELSE 0 END)
                                           ELSE x.turns[i] END
                               FROM generate_series(1, CAST(x.len AS integer)) AS i)
               END,
               x.skips
        FROM picks p CROSS JOIN seats x CROSS JOIN ok
        WHERE p_details -> p.detail_of IS NOT NULL
        RETURNING lead_id
    ), queued AS (
        -- every lead picked here was inserted by the caller's transaction, whose now() its
        -- received_at defaulted to (as record_assignments)
        INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id,
                            parent_id, lead_received_at)
        SELECT p_org, a.lead_id, a.id, p_crm_object, p.crm_id, a.crm_user_id, p.parent_id,
               now()
        FROM assigned a JOIN picks p ON p.lead_id = a.lead_id
        RETURNING lead_id
    )
    SELECT (SELECT array_agg(p.member_id ORDER BY p.ord) FROM picks p) AS member_ids,
           x.ids, x.skips, x.users, x.names,
           (SELECT count(*) FROM queued) AS queued, (SELECT count(*) FROM decided) AS decided
    FROM seats x
    INTO r;
    IF r.queued = 0 AND r.decided = 0 THEN
        -- not decided here (ok had no row, so nothing was written): the general path
        RETURN NEXT;
        RETURN;
    END IF;
    IF r.queued <> v_n THEN  -- cannot happen: every lead is picked or none is
        RAISE EXCEPTION 'route_plain_batch picked some of the leads, not all';
    END IF;
    status := 'assigned';
    member_ids := r.member_ids;
    seat_ids := r.ids;
    seat_skips := r.skips;
    seat_users := r.users;
    seat_names := r.names;
    RETURN NEXT;
END
$$;
