-- Server-side routing (db/functions/: applied on every migrate, see
-- connector/shell/migrations.py apply_functions): the one recorder (record_assignments), the
-- one router (route_team) and a new lead's one round trip (route_new_lead). Each is VOLATILE
-- plpgsql, so at READ COMMITTED each statement inside takes a fresh snapshot: a read that
-- follows the team lock sees what the previous lock holder committed.

-- route_team's and route_new_lead's results are single rows of named composite types
-- (db/functions/_result_types.sql), which a caller assigns as an expression
-- (`r := route_team(...)`), without a query's set-up. A function whose list of parameters
-- changed is a new function: the old one is dropped at the end of the migrate, with whatever
-- else the files no longer define (apply_functions).

-- THE TURNS' COUNTS: a rotation's picks and the turns credited to the reps it passed over,
-- added to the members' counts in the epoch, and the picks to their caps' counters (this
-- day and this week in the team's time zone). Every path that gives a rep a turn counts it
-- here: record_assignments (a new lead's pick) and a reassignment (db/reassign.sql
-- count_turns). p_picks may hold NULLs (leads nobody took) and a member more than once;
-- p_credit_ids holds a member at most once. Returns the number of caps' counters written
-- (two a picked member: its day and its week).
CREATE OR REPLACE FUNCTION count_turns(
    p_picks bigint[], p_credit_ids bigint[], p_credit_ns bigint[], p_day date, p_week date
)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n integer;
BEGIN
    -- One statement, and no join, grouping or sort to set up: a member's picks are counted
    -- in the array (array_positions), its credits looked up by position (p_credit_ids holds
    -- each member once), and the rows reached through the primary key. The caps' counters
    -- take the picked members' rows the UPDATE returns.
    WITH bump AS (
        UPDATE members m
        SET assigned_in_epoch = m.assigned_in_epoch
                                + cardinality(array_positions(p_picks, m.id)),
            credited_in_epoch = m.credited_in_epoch
                                + coalesce(p_credit_ns[array_position(p_credit_ids, m.id)], 0)
        WHERE m.id = ANY (p_picks || p_credit_ids)
        RETURNING m.id, cardinality(array_positions(p_picks, m.id)) AS n
    )
    INSERT INTO member_load (member_id, period, starts_on, assigned)
    SELECT b.id, w.period, w.starts_on, b.n
    FROM bump b
    CROSS JOIN (VALUES ('day', p_day), ('week', p_week)) AS w (period, starts_on)
    WHERE b.n > 0
    ON CONFLICT (member_id, period, starts_on)
    DO UPDATE SET assigned = member_load.assigned + EXCLUDED.assigned;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- THE RECORDER: every assignment is inserted here, with what goes with it in the same
-- call: the members' rotation counts and credits and the caps' counters (count_turns, when
-- p_turns: a rotation's picks; an account owner's lead is no turn), one outbox row per
-- assignment, and the leads' decisions. Leads in pick order, each with its member and that
-- member's CRM user id (p_owner_ids); a lead whose member is NULL was placed by nobody:
-- with p_reason it is recorded unassigned (its reason and decision), else nothing is written
-- for it. Assignment ids follow the picks' order, so ordering a team's assignments by id
-- replays its rotation (`connector simulate`). The decisions: p_details is one JSON array of
-- distinct decisions and p_detail_of each lead's position in it, 0-based (NULL: the lead's
-- decision is written by the caller); a pick's part (batch, epoch, chosen member and seats:
-- p_seat_ids and p_seat_weights for every lead, p_seat_skips and p_seat_counts flat, one run
-- of the seats' length per lead) goes in columns, read back through decision_details. Every
-- lead given here was inserted by this transaction, so now() is its received_at. p_notify:
-- whether the org queues notifications, as the caller read it before it took the team's lock
-- (route_team: that read is not held up behind other leads); NULL: read here. Returns the
-- number of assignments recorded.
CREATE OR REPLACE FUNCTION record_assignments(
    p_org text, p_crm_object text, p_source text, p_team_id bigint, p_epoch integer,
    p_turns boolean, p_day date, p_week date,
    p_lead_ids bigint[], p_member_ids bigint[], p_owner_ids text[], p_crm_ids text[],
    p_parent_ids text[], p_rule_indexes integer[], p_rule_names text[],
    p_sla_minutes integer[], p_account_matches jsonb, p_credit_ids bigint[],
    p_credit_ns bigint[],
    p_batch bigint, p_details jsonb, p_detail_of integer[],
    p_seat_ids bigint[], p_seat_weights integer[], p_seat_skips text[], p_seat_counts bigint[],
    p_reason text, p_notify boolean DEFAULT NULL
)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    n integer;
BEGIN
    -- Plain statements, each run only when it has work: a statement costs its executor
    -- set-up even for one row, and one WITH of every step set up all of them every call.
    IF p_turns THEN  -- a rotation's picks (an account owner's lead is no turn)
        n := count_turns(p_member_ids, p_credit_ids, p_credit_ns, p_day, p_week);
    END IF;
    -- The assignments in pick order and one outbox row each, in one statement that sets up
    -- no join or sort: each lead's assignment id is drawn in pick order (the order of the
    -- arrays, WITH ORDINALITY) before both inserts read it.
    WITH p AS (
        SELECT p.*, nextval('assignments_id_seq') AS assignment_id
        FROM unnest(p_lead_ids, p_member_ids, p_owner_ids, p_rule_indexes, p_rule_names,
                    p_sla_minutes, p_crm_ids, p_parent_ids)
             WITH ORDINALITY AS p (lead_id, member_id, owner_id, rule_index, rule_name,
                                   sla_minutes, crm_id, parent_id, ord)
        WHERE p.member_id IS NOT NULL
    ), assigned AS (
        INSERT INTO assignments (id, lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at, account_match)
        SELECT p.assignment_id, p.lead_id, p_org, p_team_id, p.member_id, p.owner_id, p_epoch,
               p.rule_index, p.rule_name, p_source,
               now() + make_interval(mins => p.sla_minutes),
               p_account_matches -> CAST(p.ord - 1 AS integer)
        FROM p
    )
    INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                        lead_received_at)
    SELECT p_org, p.lead_id, p.assignment_id, p_crm_object, p.crm_id, p.owner_id, p.parent_id,
           now()
    FROM p;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF p_reason IS NOT NULL AND n < cardinality(p_lead_ids) THEN
        UPDATE leads l SET unassigned_reason = p_reason
        FROM unnest(p_lead_ids, p_member_ids) AS p (lead_id, member_id)
        WHERE p.member_id IS NULL AND l.id = p.lead_id;
    END IF;
    IF p_details IS NOT NULL THEN
        -- in pick order, unsorted: readers order a lead's decisions by id
        INSERT INTO routing_decisions (org, lead_id, kind, detail, batch, epoch, chosen_id,
                                       seat_ids, seat_weights, seat_counts, seat_skips)
        SELECT p_org, p.lead_id, 'route',
               CASE WHEN p.member_id IS NOT NULL THEN p_details -> p.detail_of
                    ELSE (p_details -> p.detail_of) - 'sla_minutes'
                         || jsonb_build_object('outcome', 'unassigned', 'reason', p_reason)
               END,
               p_batch, CASE WHEN p.member_id IS NOT NULL THEN p_epoch END, p.member_id,
               p_seat_ids, p_seat_weights,
               p_seat_counts[(p.ord - 1) * cardinality(p_seat_ids) + 1
                             :p.ord * cardinality(p_seat_ids)],
               p_seat_skips[(p.ord - 1) * cardinality(p_seat_ids) + 1
                            :p.ord * cardinality(p_seat_ids)]
        FROM unnest(p_lead_ids, p_member_ids, p_detail_of)
             WITH ORDINALITY AS p (lead_id, member_id, detail_of, ord)
        WHERE p_details -> p.detail_of IS NOT NULL
          AND (p.member_id IS NOT NULL OR p_reason IS NOT NULL);
    END IF;
    IF n > 0 AND p_notify IS NOT FALSE THEN
        -- the reps' notifications (db/functions/notifications.sql; nothing when the org has
        -- none)
        PERFORM queue_notifications(p_org, p_lead_ids, p_member_ids, '{assigned}', 'assigned',
                                    NULL);
    END IF;
    RETURN n;
END
$$;

-- THE ROUTER: a team's leads (1..N, stored by this transaction, in the order they get their
-- turns) decided and recorded in one call: the team row is locked (the lock that serialises
-- the team's rotation in every process), the members read with a snapshot taken under that
-- lock (each statement of a VOLATILE function takes a fresh one), the picks made by
-- rotation_picks and recorded by record_assignments. What only the config knows comes in:
-- each configured member's block at p_now (p_users / p_blocked: 'away' by YAML time off,
-- 'off_shift', or NULL), its caps (a member the config does not name has the team's), K of
-- catch-up. Time off set by `connector rep away` is read here. Leads nobody can take are
-- recorded unassigned when p_final, else returned unwritten (they go on to the overflow
-- team). Status 'no_team' (nothing written): the team is not in the database.
-- A reassignment by rotation (`connector reassign --rotate`, a deactivated rep's leads, the
-- SLA re-route) decides here too: p_exclude is the lead's current owner (skipped as
-- 'current_owner', with no credit: a lead taken away is not owed back) and p_record false
-- returns the pick and its credits unrecorded, for the move to record (db/reassign.sql).
CREATE OR REPLACE FUNCTION route_team(
    p_org text, p_crm_object text, p_source text, p_team text,
    p_now timestamptz, p_day date, p_week date, p_batch bigint,
    p_users text[], p_blocked text[], p_per_day integer[], p_per_week integer[],
    p_team_per_day integer, p_team_per_week integer, p_max_in_a_row integer,
    p_lead_ids bigint[], p_crm_ids text[], p_parent_ids text[], p_rule_indexes integer[],
    p_rule_names text[], p_sla_minutes integer[], p_details jsonb, p_detail_of integer[],
    p_final boolean, p_exclude bigint, p_record boolean
)
RETURNS route_team_result
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    res route_team_result;  -- the result, returned at the end
    v_team   bigint;
    v_recent bigint[];  -- NULL until the first is read
    v_member bigint;
    v_room   integer[];
    v_turns  bigint[];
    v_why    text[];
    v_active integer;
    v_away   text[];
    r        record;
    v_n      integer;  -- record_assignments' count (an assignment, not a PERFORM query)
    v_k      integer;
    v_first  integer;
    v_skips  text[];
    v_owners text[];
    v_notify boolean;
    -- whether any cap is set: worked out before the lock (each expression PL/pgSQL runs is set
    -- up on its first run in a transaction, and what runs under the lock holds up the team)
    v_capped boolean := p_team_per_day IS NOT NULL OR p_team_per_week IS NOT NULL
                        OR cardinality(array_remove(p_per_day || p_per_week, NULL)) > 0;
BEGIN
    -- the team's lock, and whether the org queues notifications, read before the lock is
    -- waited for (the subquery is evaluated with the team's row, before its lock is taken)
    SELECT t.id, t.epoch,
           EXISTS (SELECT FROM notify_settings s
                   WHERE s.org = p_org AND cardinality(s.channels) > 0)
    INTO v_team, res.epoch, v_notify
    FROM teams t WHERE t.org = p_org AND t.name = p_team AND t.in_config FOR UPDATE;
    IF NOT FOUND THEN
        res.status := 'no_team';
        RETURN res;
    END IF;
    -- catch-up's latest owners, newest first, read under the lock. The constant LIMIT is the
    -- largest K (config.py MAX_IN_A_ROW): a LIMIT given as a parameter is unknown to a
    -- generic plan, which the planner then costs by the size of `assignments` and re-plans
    -- on every call; with the constant it reads the team's index backwards, and the loop
    -- stops after K.
    IF p_max_in_a_row IS NOT NULL THEN
        FOR v_member IN
            SELECT a.member_id FROM assignments a WHERE a.team_id = v_team
            ORDER BY a.id DESC LIMIT 1000
        LOOP
            v_recent := v_recent || v_member;
            EXIT WHEN cardinality(v_recent) >= p_max_in_a_row;
        END LOOP;
    END IF;
    -- The members, in a new statement: a fresh snapshot, so the counts the previous lock
    -- holder committed. The rotation's seats first, in its order, then the inactive ones:
    -- the aggregates take the rows in the order the subquery sorts them (plain aggregates
    -- over a sorted subquery with nothing else at their level; one sort, where an ORDER BY
    -- in each aggregate sorts once per aggregate).
    SELECT coalesce(array_agg(y.id), '{}'), coalesce(array_agg(y.crm_user_id), '{}'),
           coalesce(array_agg(y.name), '{}'), coalesce(array_agg(y.weight), '{}'),
           array_agg(y.turns), array_agg(y.why),
           CAST(count(*) FILTER (WHERE y.active) AS integer),
           array_agg(y.crm_user_id) FILTER (WHERE y.away_cmd)
    INTO res.seat_ids, res.seat_users, res.seat_names, res.seat_weights, v_turns, v_why,
         v_active, v_away
    FROM (
        SELECT mb.id, mb.crm_user_id, mb.name, mb.weight, mb.active,
               mb.assigned_in_epoch + mb.credited_in_epoch AS turns,
               CASE WHEN mb.id = p_exclude THEN 'current_owner'
                    WHEN NOT mb.active THEN 'inactive'
                    WHEN o.starts_at <= p_now AND p_now < o.until THEN 'away'
                    ELSE p_blocked[array_position(p_users, mb.crm_user_id)] END AS why,
               coalesce(o.starts_at <= p_now AND p_now < o.until, false) AS away_cmd
        FROM members mb
        LEFT JOIN rep_time_off o ON o.org = p_org AND o.crm_user_id = mb.crm_user_id
        WHERE mb.team_id = v_team AND mb.in_config
        ORDER BY NOT mb.active, CASE WHEN mb.active THEN mb.weight END DESC, mb.position,
                 mb.id
    ) y;
    IF v_capped THEN
        -- the caps' room, seat by seat: a member the config does not name has the team's
        -- caps; NULL: no cap (least and greatest skip NULLs, so a NULL room is left only
        -- when neither is set). A count is read only for a cap that is set.
        SELECT array_agg(CASE WHEN cap.day IS NOT NULL OR cap.week IS NOT NULL THEN
                         greatest(0, least(cap.day - coalesce(d.assigned, 0),
                                           cap.week - coalesce(w.assigned, 0))) END
                         ORDER BY q.ord)
        INTO v_room
        FROM unnest(res.seat_ids, res.seat_users) WITH ORDINALITY AS q (id, usr, ord)
        CROSS JOIN LATERAL (SELECT array_position(p_users, q.usr) AS i) c
        CROSS JOIN LATERAL (
            SELECT CASE WHEN c.i IS NULL THEN p_team_per_day ELSE p_per_day[c.i] END AS day,
                   CASE WHEN c.i IS NULL THEN p_team_per_week ELSE p_per_week[c.i] END AS week
        ) cap
        LEFT JOIN LATERAL (
            SELECT l.assigned FROM member_load l
            WHERE cap.day IS NOT NULL
              AND l.member_id = q.id AND l.period = 'day' AND l.starts_on = p_day
        ) d ON true
        LEFT JOIN LATERAL (
            SELECT l.assigned FROM member_load l
            WHERE cap.week IS NOT NULL
              AND l.member_id = q.id AND l.period = 'week' AND l.starts_on = p_week
        ) w ON true;
    END IF;
    -- reps away by `connector rep away` now, sorted by code point (as Python sorts)
    IF v_away IS NULL THEN
        res.away_by_command := '{}';
    ELSE
        SELECT array_agg(u ORDER BY u COLLATE "C") INTO res.away_by_command
        FROM unnest(v_away) AS u;
        -- in the decisions, with those a lead met in the teams it overflowed from
        SELECT jsonb_agg(e || jsonb_build_object('away_by_command', (
                   SELECT to_jsonb(array_agg(x.u ORDER BY x.u COLLATE "C"))
                   FROM (SELECT jsonb_array_elements_text(coalesce(e -> 'away_by_command',
                                                                   '[]'))
                         UNION
                         SELECT unnest(res.away_by_command)) AS x (u))))
        INTO p_details FROM jsonb_array_elements(p_details) AS e;
    END IF;
    r := rotation_picks(res.seat_ids, res.seat_weights, v_turns, v_why, v_room, v_active,
                        p_max_in_a_row, v_recent, coalesce(cardinality(p_lead_ids), 0));
    res.member_ids := r.picks;
    res.seat_skips := r.skips;
    res.seat_counts := r.counts;
    v_first := array_position(r.picks, NULL);
    IF v_first IS NOT NULL THEN
        -- nobody can take this lead, nor (caps only fill) any after it
        v_k := cardinality(res.seat_ids);
        v_skips := r.skips[(v_first - 1) * v_k + 1:v_first * v_k];
        res.reason := CASE
            WHEN v_active = 0 THEN 'no_active_member'
            WHEN 'capped' = ANY (v_skips[1:v_active]) THEN 'all_capped'
            ELSE 'none_available' END;
    END IF;
    IF NOT p_record THEN
        res.credit_ids := r.credit_ids;
        res.credit_ns := r.credit_ns;
        res.status := 'picked';
        RETURN res;
    END IF;
    -- each pick's CRM user id, for its assignment and outbox row
    v_owners := '{}';
    FOREACH v_member IN ARRAY r.picks LOOP
        v_owners := v_owners || res.seat_users[array_position(res.seat_ids, v_member)];
    END LOOP;
    v_n := record_assignments(
        p_org, p_crm_object, p_source, v_team, res.epoch, true, p_day, p_week,
        p_lead_ids, r.picks, v_owners, p_crm_ids, p_parent_ids, p_rule_indexes, p_rule_names,
        p_sla_minutes, NULL, r.credit_ids, r.credit_ns, p_batch, p_details, p_detail_of,
        res.seat_ids, res.seat_weights, r.skips, r.counts,
        CASE WHEN p_final THEN res.reason END, v_notify);
    res.status := 'routed';
    RETURN res;
END
$$;

-- route_new_lead: one new lead of a rotation rule in ONE call: stored under its unique key,
-- then decided and recorded by route_team (the team locked for this call plus the commit).
-- Its owner (CRM user id and name) is in owner_id and owner_name, the seats it met in seat_ids
-- and seat_skips. A repeat gets its stored outcome (status 'duplicate'), even when its team
-- left the database; 'no_team' when the team is not in the database (nothing kept).
CREATE OR REPLACE FUNCTION route_new_lead(
    p_org text, p_crm_object text, p_source text, p_crm_id text, p_fields jsonb,
    p_parent_id text, p_team text, p_rule_index integer, p_rule_name text,
    p_now timestamptz, p_day date, p_week date,
    p_users text[], p_blocked text[], p_per_day integer[], p_per_week integer[],
    p_team_per_day integer, p_team_per_week integer, p_max_in_a_row integer,
    p_detail jsonb, p_sla_minutes integer
)
RETURNS route_new_lead_result
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    res route_new_lead_result;  -- the result, returned at the end
    v_lead bigint;
    v_seat integer;
    r      record;
BEGIN
    res.team := p_team;
    -- the team's presence is route_team's check (under its lock): a new lead of a team
    -- not in the database is removed again in this call, and the statement keeps nothing
    INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
    VALUES (p_org, p_crm_object, p_crm_id, p_fields, p_parent_id, p_source)
    ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING
    RETURNING id INTO v_lead;
    IF v_lead IS NOT NULL THEN
        res.lead_id := v_lead;
        r := route_team(p_org, p_crm_object, p_source, p_team, p_now, p_day, p_week, v_lead,
                        p_users, p_blocked, p_per_day, p_per_week, p_team_per_day,
                        p_team_per_week, p_max_in_a_row, ARRAY[v_lead], ARRAY[p_crm_id],
                        ARRAY[p_parent_id], ARRAY[p_rule_index], ARRAY[p_rule_name],
                        ARRAY[p_sla_minutes], jsonb_build_array(p_detail), ARRAY[0], true,
                        NULL, true);
        IF r.status = 'no_team' THEN  -- not in the database (or retired while it waited)
            DELETE FROM leads l WHERE l.id = v_lead;
            res.status := 'no_team';
            res.lead_id := NULL;
            RETURN res;
        END IF;
        res.status := 'routed';
        res.reason := r.reason;
        res.member_ids := r.member_ids;
        res.seat_ids := r.seat_ids;
        res.seat_skips := r.seat_skips;
        v_seat := array_position(r.seat_ids, r.member_ids[1]);  -- NULL: nobody took it
        res.owner_id := r.seat_users[v_seat];
        res.owner_name := r.seat_names[v_seat];
        RETURN res;
    END IF;
    SELECT l.id, a.crm_user_id, t.name, mm.name,
           CASE WHEN a.crm_user_id IS NULL THEN l.unassigned_reason END
    INTO res.lead_id, res.owner_id, res.team, res.owner_name, res.reason
    FROM leads l
    LEFT JOIN assignments a ON a.lead_id = l.id
    LEFT JOIN teams t ON t.id = a.team_id
    LEFT JOIN members mm ON mm.id = a.member_id
    WHERE l.org = p_org AND l.crm_object = p_crm_object AND l.crm_id = p_crm_id
      AND l.merged_into IS NULL;
    res.status := CASE WHEN FOUND THEN 'duplicate' ELSE 'no_team' END;
    IF NOT FOUND THEN
        res.team := p_team;
    END IF;
    RETURN res;
END
$$;
