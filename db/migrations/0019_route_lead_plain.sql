-- route_lead (migration 0014), faster, same decisions:
-- * Re-planned on every call. Its member read also read catch-up's latest owners, with a
--   LIMIT a generic plan cannot know; the planner then costed the generic plan by the size of
--   `assignments` and, with 200,000 rows there (not with a few thousand), chose a fresh
--   custom plan for that statement on every call: 0.5 ms of planning per lead, measured with
--   pg_stat_statements (track = all, track_planning) on PostgreSQL 15. The latest owners are
--   now read by a loop of their own (with a constant LIMIT, the largest K), only for a team
--   with catch-up, so no statement's generic plan depends on a LIMIT parameter.
-- * The plain rotation's pick in SQL. When no seat is blocked or capped and the team has no
--   catch-up (the common case: nothing to skip, credit or exclude), rotation_pick's plpgsql
--   loop picks the released seat with the earliest deadline; rotation_pick_plain, a
--   set-returning SQL function the planner inlines, picks the same seat with a few sorts of
--   the team's seats (no loop).
--   tests/test_route_lead.py checks it against rotation_pick and pick_available.
-- * The members it bumps (the pick and the credited seats) are updated by primary key: the
--   join with the credits was planned as a scan of every member of every team.
-- * A repeat's stored outcome is looked up in one place (two copies before).

-- Same columns as rotation_pick; ids/weights/turns/positions describe the ACTIVE seats.
-- Seats in rotation order (heavier first, then position, then id); the pick: released seats
-- (turns * total / weight <= the turns given so far) before the others, then the earliest
-- deadline, then rotation order (rotation_pick keeps the first of equal deadlines).
CREATE FUNCTION rotation_pick_plain(
    ids bigint[], weights integer[], turns bigint[], positions integer[]
)
RETURNS TABLE (
    member_id bigint, cand_ids bigint[], cand_skips text[], credit_ids bigint[],
    credit_ns bigint[], cand_weights integer[], cand_turns bigint[]
)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    WITH s AS (
        SELECT u.id, u.w, u.t, row_number() OVER (ORDER BY u.w DESC, u.p, u.id) AS k
        FROM unnest(ids, weights, turns, positions) AS u (id, w, t, p)
    ), total AS (
        SELECT CAST(sum(s.w) AS bigint) AS w, CAST(sum(s.t) AS bigint) AS slot FROM s
    )
    SELECT (SELECT s.id FROM s, total
            ORDER BY s.t * total.w / s.w > total.slot,
                     ((s.t + 1) * total.w + s.w - 1) / s.w, s.k
            LIMIT 1),
           coalesce(array_agg(s.id ORDER BY s.k), '{}'),
           array_fill(NULL::text, ARRAY[CAST(count(*) AS integer)]),
           CAST('{}' AS bigint[]), CAST('{}' AS bigint[]),
           coalesce(array_agg(s.w ORDER BY s.k), '{}'),
           coalesce(array_agg(s.t ORDER BY s.k), '{}')
    FROM s
$$;

-- Assign one new lead of a rotation rule (no overflow team): see the top of migration 0014.
-- users/blocked/per_day/per_week describe the configured members (by CRM user id); a member
-- row the config does not name gets the team's caps (team_per_day, team_per_week).
-- Returns status 'assigned', 'unassigned' (reason set), 'duplicate' (the stored outcome of
-- the existing lead) or 'no_team' (nothing written: the team is not in the database).
CREATE OR REPLACE FUNCTION route_lead(
    p_org text, p_crm_object text, p_source text, p_crm_id text, p_fields jsonb,
    p_parent_id text, p_team text, p_rule_index integer, p_rule_name text,
    p_now timestamptz, p_day date, p_week date,
    p_users text[], p_blocked text[], p_per_day integer[], p_per_week integer[],
    p_team_per_day integer, p_team_per_week integer, p_max_in_a_row integer,
    p_detail jsonb, p_sla_minutes integer
)
RETURNS TABLE (
    status text, lead_id bigint, team text, owner_id text, owner_name text, reason text,
    cand_ids bigint[], cand_skips text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_lead    bigint;
    v_received timestamptz;
    v_team    bigint;
    v_epoch   integer;
    m         record;
    v_reason  text;
    v_weights integer[];
    v_counts  bigint[];
    v_owner   text;
    v_name    text;
    v_detail  jsonb;
    v_recent  bigint[] := '{}';
    v_has_team boolean;
    v_member  bigint;
BEGIN
    team := p_team;
    PERFORM FROM teams t WHERE t.org = p_org AND t.name = p_team AND t.in_config;
    v_has_team := FOUND;
    IF v_has_team THEN
        INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
        VALUES (p_org, p_crm_object, p_crm_id, p_fields, p_parent_id, p_source)
        ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING
        RETURNING id, received_at INTO v_lead, v_received;
    END IF;
    IF v_lead IS NULL THEN
        -- A repeat gets its stored outcome, even when its team left the database, as on the
        -- general path (which never looks at the team of a lead it already has).
        SELECT l.id, a.crm_user_id, t.name, mm.name,
               CASE WHEN a.crm_user_id IS NULL THEN l.unassigned_reason END
        INTO lead_id, owner_id, team, owner_name, reason
        FROM leads l
        LEFT JOIN assignments a ON a.lead_id = l.id
        LEFT JOIN teams t ON t.id = a.team_id
        LEFT JOIN members mm ON mm.id = a.member_id
        WHERE l.org = p_org AND l.crm_object = p_crm_object AND l.crm_id = p_crm_id
          AND l.merged_into IS NULL;
        IF FOUND OR v_has_team THEN
            status := 'duplicate';
        ELSE  -- nothing written
            status := 'no_team';
            team := p_team;
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    lead_id := v_lead;
    SELECT t.id, t.epoch INTO v_team, v_epoch
    FROM teams t WHERE t.org = p_org AND t.name = p_team AND t.in_config FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'team of org is no longer in the database' USING ERRCODE = 'P0002';
    END IF;
    -- catch-up's latest owners, newest first, read after the lock (a fresh snapshot). Not
    -- in the member read below, and not with LIMIT K: a LIMIT that is a parameter is unknown
    -- to a generic plan, which the planner then costs by the size of `assignments`, and it
    -- re-plans the statement on every call (the header of migration 0019). The constant
    -- LIMIT is the largest K (config.py MAX_IN_A_ROW): with it the generic plan reads the
    -- team's index backwards (without it, a sort of the team's whole history), and the loop
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
    -- A new statement, so a fresh snapshot: the counts and caps counters the previous lock
    -- holder committed. The pick is made in the same statement.
    SELECT x.*, p.member_id AS pick, p.cand_ids AS seat_ids, p.cand_skips AS seat_skips,
           p.cand_weights AS seat_weights, p.cand_turns AS seat_turns, p.credit_ids, p.credit_ns,
           x.users[array_position(x.ids, p.member_id)] AS owner,
           x.names[array_position(x.ids, p.member_id)] AS owner_name
    INTO m
    FROM (
        -- every array is aggregated from the same row stream, so they stay aligned; the
        -- rotation sorts its seats itself
        SELECT array_agg(y.id) AS ids, array_agg(y.weight) AS weights,
               array_agg(y.turns) AS turns, array_agg(y.active) AS active,
               array_agg(y.crm_user_id) AS users, array_agg(y.name) AS names,
               array_agg(y.position) AS positions,
               -- reps away by `connector rep away` now, sorted by code point (as Python sorts)
               coalesce(array_agg(y.crm_user_id ORDER BY y.crm_user_id COLLATE "C")
                        FILTER (WHERE y.away_cmd), '{}') AS away_cmd,
               coalesce(array_agg(y.id) FILTER (WHERE y.active), '{}') AS s_ids,
               coalesce(array_agg(y.weight) FILTER (WHERE y.active), '{}') AS s_weights,
               coalesce(array_agg(y.turns) FILTER (WHERE y.active), '{}') AS s_turns,
               coalesce(array_agg(y.position) FILTER (WHERE y.active), '{}') AS s_positions,
               coalesce(array_agg(y.why) FILTER (WHERE y.active), '{}') AS s_why,
               coalesce(array_agg(y.room) FILTER (WHERE y.active), '{}') AS s_room,
               -- nothing to skip or credit and no catch-up: the plain rotation's pick
               p_max_in_a_row IS NULL
               AND coalesce(bool_and(y.why IS NULL AND coalesce(y.room, 1) > 0)
                            FILTER (WHERE y.active), true) AS plain
        FROM (
            SELECT mb.id, mb.weight, mb.assigned_in_epoch + mb.credited_in_epoch AS turns,
                   mb.position, mb.active, mb.crm_user_id, mb.name,
                   CASE WHEN o.starts_at <= p_now AND p_now < o.until THEN 'away'
                        ELSE p_blocked[c.i] END AS why,
                   coalesce(o.starts_at <= p_now AND p_now < o.until, false) AS away_cmd,
                   CASE WHEN cap.day IS NOT NULL OR cap.week IS NOT NULL THEN
                   greatest(0, least(cap.day - coalesce(d.assigned, 0),
                                     cap.week - coalesce(w.assigned, 0))) END AS room
            FROM members mb
            CROSS JOIN LATERAL (SELECT array_position(p_users, mb.crm_user_id) AS i) c
            -- a member the config does not name has the team's caps; NULL: no cap (least
            -- and greatest skip NULLs, so a NULL room is left only when neither is set)
            CROSS JOIN LATERAL (
                SELECT CASE WHEN c.i IS NULL THEN p_team_per_day ELSE p_per_day[c.i] END AS day,
                       CASE WHEN c.i IS NULL THEN p_team_per_week ELSE p_per_week[c.i] END
                           AS week
            ) cap
            -- time off set from the command line, looked up only when the org has some
            LEFT JOIN LATERAL (
                SELECT t.starts_at, t.until FROM rep_time_off t
                WHERE (SELECT EXISTS (SELECT FROM rep_time_off a WHERE a.org = p_org))
                  AND t.org = p_org AND t.crm_user_id = mb.crm_user_id
            ) o ON true
            -- a count is read only for a cap that is set (the test gates the index probe)
            LEFT JOIN LATERAL (
                SELECT l.assigned FROM member_load l
                WHERE cap.day IS NOT NULL
                  AND l.member_id = mb.id AND l.period = 'day' AND l.starts_on = p_day
            ) d ON true
            LEFT JOIN LATERAL (
                SELECT l.assigned FROM member_load l
                WHERE cap.week IS NOT NULL
                  AND l.member_id = mb.id AND l.period = 'week' AND l.starts_on = p_week
            ) w ON true
            WHERE mb.team_id = v_team AND mb.in_config
        ) y
    ) x
    -- only one arm runs: each is gated by x.plain (a one-time filter)
    CROSS JOIN LATERAL (
        SELECT * FROM rotation_pick_plain(x.s_ids, x.s_weights, x.s_turns, x.s_positions)
        WHERE x.plain
        UNION ALL
        SELECT * FROM rotation_pick(
            x.s_ids, x.s_weights, x.s_turns, x.s_positions, x.s_why, x.s_room,
            p_max_in_a_row, v_recent)
        WHERE NOT x.plain
    ) p;
    v_owner := m.owner;
    v_name := m.owner_name;
    -- Every configured member as the decision records it (the rotation's seats in its
    -- order, then the inactive ones by position), with its weight and count, compactly:
    -- connector/routing/decisions.py `expand` turns this into the full form for explain.
    cand_ids := m.seat_ids;
    cand_skips := m.seat_skips;
    v_weights := m.seat_weights;
    v_counts := m.seat_turns;
    IF false = ANY (m.active) THEN
        SELECT cand_ids || array_agg(u.id ORDER BY u.p),
               cand_skips || array_agg('inactive'::text ORDER BY u.p),
               v_weights || array_agg(u.w ORDER BY u.p),
               v_counts || array_agg(u.t ORDER BY u.p)
        INTO cand_ids, cand_skips, v_weights, v_counts
        FROM unnest(m.ids, m.active, m.positions, m.weights, m.turns) u (id, a, p, w, t)
        WHERE NOT u.a;
    END IF;
    v_detail := p_detail || jsonb_build_object(
        'batch', v_lead,
        'team', p_team,
        'seats', jsonb_build_object('ids', cand_ids, 'weights', v_weights, 'counts', v_counts,
                                    'skips', cand_skips))
        || CASE WHEN cardinality(m.away_cmd) > 0
                THEN jsonb_build_object('away_by_command', m.away_cmd) ELSE '{}'::jsonb END;
    IF m.pick IS NULL THEN
        v_reason := CASE
            WHEN NOT (true = ANY (coalesce(m.active, '{}'))) THEN 'no_active_member'
            WHEN 'capped' = ANY (m.seat_skips) THEN 'all_capped'
            ELSE 'none_available' END;
        UPDATE leads SET unassigned_reason = v_reason WHERE id = v_lead;
        INSERT INTO routing_decisions (org, lead_id, kind, detail)
        VALUES (p_org, v_lead, 'route',
                v_detail || jsonb_build_object('outcome', 'unassigned', 'reason', v_reason));
        status := 'unassigned';
        reason := v_reason;
        RETURN NEXT;
        RETURN;
    END IF;
    -- every write in one statement (like record_assignments and record_decisions)
    WITH bump AS (
        -- the pick and the credited seats, by primary key (a join with the credits was
        -- planned as a scan of every member of every team)
        UPDATE members mb
        SET assigned_in_epoch = mb.assigned_in_epoch
                                + CASE WHEN mb.id = m.pick THEN 1 ELSE 0 END,
            credited_in_epoch = mb.credited_in_epoch
                                + coalesce(m.credit_ns[array_position(m.credit_ids, mb.id)], 0)
        WHERE mb.id = ANY (m.pick || m.credit_ids)
        RETURNING mb.id
    ), load AS (
        INSERT INTO member_load (member_id, period, starts_on, assigned)
        VALUES (m.pick, 'day', p_day, 1), (m.pick, 'week', p_week, 1)
        ON CONFLICT (member_id, period, starts_on)
        DO UPDATE SET assigned = member_load.assigned + 1
        RETURNING member_id
    ), assigned AS (
        INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at)
        VALUES (v_lead, p_org, v_team, m.pick, v_owner, v_epoch, p_rule_index,
                p_rule_name, p_source, now() + make_interval(mins => p_sla_minutes))
        RETURNING id
    ), outbox AS (
        INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id,
                            parent_id, lead_received_at)
        SELECT p_org, v_lead, assigned.id, p_crm_object, p_crm_id, v_owner, p_parent_id,
               v_received
        FROM assigned
        RETURNING id
    )
    INSERT INTO routing_decisions (org, lead_id, kind, detail)
    VALUES (p_org, v_lead, 'route',
            v_detail || jsonb_build_object('epoch', v_epoch, 'outcome', 'assigned',
                                           'chosen_id', m.pick)
            || CASE WHEN p_sla_minutes IS NULL THEN '{}'::jsonb
                    ELSE jsonb_build_object('sla_minutes', p_sla_minutes) END);
    status := 'assigned';
    owner_id := v_owner;
    owner_name := v_name;
    RETURN NEXT;
END
$$;
