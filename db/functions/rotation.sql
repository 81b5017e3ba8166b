-- The rotation's pick on the server (db/functions/: applied on every migrate, see
-- connector/shell/store.py apply_functions). Mirrors of connector/routing/rotation.py
-- `pick_available` for one lead, property-tested against it (tests/test_route_lead.py).

-- One pick of the weighted Pfair rotation (earliest deadline first) over a team's ACTIVE
-- seats, with caps, credits and catch-up, exactly as pick_available picks one lead.
-- blocked: 'away' or 'off_shift' (NULL: may take a lead); room: leads its caps still allow
-- (NULL: no cap); max_in_a_row: K of catch_up, NULL for catch_up none (K applies only to reps
-- whose share is at most K of every K+1 leads); recent: the team's latest owners, newest
-- first. Returns the pick (NULL: nobody can take the lead), every seat in rotation order with
-- its skip reason (and its weight and turns, for the decision), and the turns credited to
-- passed-over seats.
CREATE OR REPLACE FUNCTION rotation_pick(
    ids bigint[], weights integer[], turns bigint[], positions integer[], blocked text[],
    room integer[], max_in_a_row integer, recent bigint[],
    OUT member_id bigint, OUT cand_ids bigint[], OUT cand_skips text[],
    OUT credit_ids bigint[], OUT credit_ns bigint[],
    OUT cand_weights integer[], OUT cand_turns bigint[]
)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    n      integer := coalesce(array_length(ids, 1), 0);
    ord    integer[];
    t      bigint[] := turns;
    why    text[];
    credit boolean[];
    gave   bigint[];
    total  bigint := 0;
    slot   bigint := 0;
    able   integer := 0;
    excl   integer;
    best   integer;
    dl     bigint;
    best_dl bigint;
    i      integer;
BEGIN
    cand_ids := '{}'; cand_skips := '{}'; credit_ids := '{}'; credit_ns := '{}';
    cand_weights := '{}'; cand_turns := '{}';
    IF n = 0 THEN
        RETURN;
    END IF;
    SELECT array_agg(x.i ORDER BY weights[x.i] DESC, positions[x.i], ids[x.i]) INTO ord
    FROM generate_subscripts(ids, 1) AS x (i);
    why := array_fill(NULL::text, ARRAY[n]);
    credit := array_fill(false, ARRAY[n]);
    gave := array_fill(0::bigint, ARRAY[n]);
    FOREACH i IN ARRAY ord LOOP
        total := total + weights[i];
        slot := slot + t[i];
        why[i] := coalesce(blocked[i], CASE WHEN room[i] = 0 THEN 'capped' END);
        credit[i] := why[i] IN ('capped', 'off_shift')
                     OR (why[i] = 'away' AND max_in_a_row IS NULL);
        IF why[i] IS NULL THEN
            able := able + 1;
        END IF;
        cand_ids := cand_ids || ids[i];
        cand_skips := cand_skips || why[i];
        cand_weights := cand_weights || weights[i];
        cand_turns := cand_turns || turns[i];
    END LOOP;
    IF able = 0 THEN
        RETURN;
    END IF;
    -- catch-up: no (K+1)-th lead in a row while another rep can take it, unless that rep is
    -- already ahead of its share, or its share is more than K of every K+1 leads (then K
    -- would hold it below its share for ever: it follows the plain rotation)
    IF max_in_a_row IS NOT NULL AND able > 1
       AND coalesce(array_length(recent, 1), 0) >= max_in_a_row
       AND recent[1:max_in_a_row] <@ ARRAY[recent[1]] THEN
        excl := array_position(ids, recent[1]);
        IF excl IS NOT NULL
           AND NOT (why[excl] IS NULL AND slot * weights[excl] >= t[excl] * total
                    AND max_in_a_row * total >= (max_in_a_row + 1) * weights[excl]) THEN
            excl := NULL;
        END IF;
    END IF;
    LOOP
        best := NULL;
        FOREACH i IN ARRAY ord LOOP
            CONTINUE WHEN i = excl OR NOT (why[i] IS NULL OR credit[i])
                          OR t[i] * total / weights[i] > slot;
            dl := ((t[i] + 1) * total + weights[i] - 1) / weights[i];
            IF best IS NULL OR dl < best_dl THEN
                best := i;
                best_dl := dl;
            END IF;
        END LOOP;
        IF best IS NOT NULL THEN
            IF credit[best] THEN  -- passed over: its turn is credited, the schedule moves on
                t[best] := t[best] + 1;
                gave[best] := gave[best] + 1;
                slot := slot + 1;
                CONTINUE;
            END IF;
        ELSE  -- the away reps' share is not consumed: serve the earliest deadline
            FOREACH i IN ARRAY ord LOOP
                CONTINUE WHEN i = excl OR why[i] IS NOT NULL;
                dl := ((t[i] + 1) * total + weights[i] - 1) / weights[i];
                IF best IS NULL OR dl < best_dl THEN
                    best := i;
                    best_dl := dl;
                END IF;
            END LOOP;
        END IF;
        EXIT;
    END LOOP;
    member_id := ids[best];
    FOREACH i IN ARRAY ord LOOP
        IF gave[i] > 0 THEN
            credit_ids := credit_ids || ids[i];
            credit_ns := credit_ns || gave[i];
        END IF;
    END LOOP;
END
$$;

-- Same columns as rotation_pick; ids/weights/turns/positions describe the ACTIVE seats.
-- Seats in rotation order (heavier first, then position, then id); the pick: released seats
-- (turns * total / weight <= the turns given so far) before the others, then the earliest
-- deadline, then rotation order (rotation_pick keeps the first of equal deadlines).
CREATE OR REPLACE FUNCTION rotation_pick_plain(
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
