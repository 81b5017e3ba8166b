-- Server-side routing of new leads (db/functions/: applied on every migrate, see
-- connector/shell/store.py apply_functions).

-- One round trip per lead: the common single-lead assignment as one server-side call.
-- `route_lead` inserts the lead, locks its team row, reads the members with their turns,
-- CLI time off and caps counters, picks with `rotation_pick` (db/functions/rotation.sql),
-- records the assignment, counts, credits, caps counters, outbox row and decision, and
-- returns the outcome: the team row stays locked for this one statement plus the commit.
-- It is VOLATILE plpgsql, so at READ COMMITTED each statement inside takes a fresh snapshot:
-- the member read that follows the lock sees what the previous lock holder committed
-- (tests/test_route_lead.py checks this). What only the config knows (working hours and YAML
-- time off at the caller's `now`, the caps' values, the rules tried) is computed by the
-- caller before the call and passed in. Catch-up's latest owners are read by a loop of their
-- own; the plain rotation's pick is rotation_pick_plain; the members are bumped by primary key.
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

-- A PLAIN team's new lead (no caps, no catch-up, nobody blocked by the config at the call's
-- now: connector/routing/single.py plain_call), decided and recorded with route_lead's
-- records in one call of two statements, the second with a fresh snapshot taken under the
-- team's lock (no row lock on the members, no team version to compare, no exception block).
-- The statements sit in a function so that the client sends a short call (the driver
-- re-parses a statement text over 4 KB on every call). One sorted pass over the seats gives
-- the rotation's totals and the decision's arrays, and the pick is one ordered read of the
-- active seats (rotation_pick_plain's ordering, which route_lead uses). A lead it hands on
-- (status 'route_lead': the caller then calls route_lead) is deleted under the lock, unless
-- the team was retired while it waited; that delete's check of leads.merged_into reads
-- leads_merged_into. Its decision is the caller's p_detail plus the pick's part in columns of
-- routing_decisions (no JSON built under the team's lock; read them through decision_details,
-- db/functions/decisions.sql). Otherwise status 'assigned' and the columns route_lead returns.
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

-- route_plain_batch: a batch's leads of one plain team of equal weights, locked, picked and
-- recorded in one call (as record_assignments records them); status 'general' when it left
-- them to the general path, having written nothing.
CREATE OR REPLACE FUNCTION route_plain_batch(
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
