-- The rotation's picks on the server (db/functions/: applied on every migrate, see
-- connector/shell/migrations.py apply_functions).

-- The weighted rotation for the next p_count leads of a team: the production form of
-- connector/routing/rotation.py pick_available (the executable specification, which
-- `connector simulate` replays with; tests/test_rotation_sql.py holds the two together, pick
-- for pick). It runs on the server so that a lead is decided in the one round trip that
-- holds the team's lock: done in the client, the lock would also be held across the round
-- trip that brings the seats back.
-- Seats 1..p_active are the rotation's, in its order (heavier first, then position, then
-- id); seats after them are inactive members, listed only for the decisions. blocked:
-- 'away', 'off_shift' or 'inactive' (NULL: may take a lead); room: leads its caps still allow
-- (NULL: no cap); max_in_a_row: K of catch_up (NULL: catch_up none); recent: the team's
-- latest owners, newest first. Returns each lead's pick (NULL: nobody could take it) and,
-- per lead, every seat's skip reason and its count at that pick (flat: seat i of lead j at
-- (j - 1) * cardinality(ids) + i; counts advance by picks, as a decision records them), and
-- the turns credited to the seats passed over.
--
-- Its result type, rotation_picks_result, is in db/functions/_result_types.sql.
CREATE OR REPLACE FUNCTION rotation_picks(
    ids bigint[], weights integer[], turns bigint[], blocked text[], room integer[],
    p_active integer, max_in_a_row integer, recent bigint[], p_count integer
)
RETURNS rotation_picks_result
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    -- Arrays start NULL (an append to NULL makes the array, a subscript of NULL reads NULL):
    -- each initialised variable is an expression PL/pgSQL sets up once per transaction.
    -- The parameters turns (which counts credited turns too), room and blocked (which takes
    -- 'capped' when a cap fills) are worked on in place.
    picks  bigint[];
    skips  text[];
    counts bigint[];
    credit_ids bigint[];
    credit_ns  bigint[];
    k      integer := coalesce(p_active, 0);
    shown  bigint[] := turns;   -- what a decision records: advanced by picks only
    cred   boolean[];           -- passed over with a credit (NULL: no)
    gave   bigint[];            -- turns credited (NULL: none)
    hist   bigint[];
    total  bigint := 0;
    slot   bigint := 0;
    able   integer := 0;
    excl   integer;
    best   integer;
    dl     bigint;
    best_dl bigint;
    i      integer;
    j      integer;
BEGIN
    IF p_count IS NULL OR p_count <= 0 THEN
        RETURN ROW('{}'::bigint[], '{}'::text[], '{}'::bigint[], '{}'::bigint[],
                   '{}'::bigint[]);
    END IF;
    IF max_in_a_row IS NOT NULL THEN
        hist := coalesce(recent[1:max_in_a_row], '{}');
    END IF;
    FOR i IN 1..k LOOP
        total := total + weights[i];
        slot := slot + turns[i];
        IF blocked[i] IS NOT NULL THEN
            -- passed over with a credit: capped, off shift, and away unless the team
            -- catches up
            cred[i] := blocked[i] IN ('capped', 'off_shift')
                       OR (blocked[i] = 'away' AND max_in_a_row IS NULL);
        ELSIF room[i] = 0 THEN
            blocked[i] := 'capped';
            cred[i] := true;
        ELSE
            able := able + 1;
        END IF;
    END LOOP;
    FOR j IN 1..p_count LOOP
        skips := skips || blocked;
        counts := counts || shown;
        IF able = 0 THEN
            picks := picks || NULL::bigint;
            CONTINUE;
        END IF;
        -- catch-up: no (K+1)-th lead in a row while another rep can take it, unless that rep
        -- is already ahead of its share, or its share is more than K of every K+1 leads
        -- (tested in a block of its own: PL/pgSQL sets up a whole condition the first time it
        -- runs in a transaction, however little of it a team without catch-up evaluates)
        IF max_in_a_row IS NOT NULL THEN
            excl := NULL;
            IF able > 1 AND cardinality(hist) >= max_in_a_row
               AND hist[1:max_in_a_row] <@ ARRAY[hist[1]] THEN
                excl := array_position(ids[1:k], hist[1]);
                IF excl IS NOT NULL
                   AND NOT (blocked[excl] IS NULL
                            AND slot * weights[excl] >= turns[excl] * total
                            AND max_in_a_row * total >= (max_in_a_row + 1) * weights[excl]) THEN
                    excl := NULL;
                END IF;
            END IF;
        END IF;
        LOOP
            best := NULL;
            FOR i IN 1..k LOOP
                -- released (its next turn is due) and earlier than the best so far
                dl := ((turns[i] + 1) * total + weights[i] - 1) / weights[i];
                IF (blocked[i] IS NULL OR cred[i]) AND i IS DISTINCT FROM excl
                   AND turns[i] * total / weights[i] <= slot
                   AND (best IS NULL OR dl < best_dl) THEN
                    best := i;
                    best_dl := dl;
                END IF;
            END LOOP;
            IF best IS NOT NULL THEN
                IF blocked[best] IS NOT NULL THEN  -- credited; the schedule moves on
                    turns[best] := turns[best] + 1;
                    gave[best] := coalesce(gave[best], 0) + 1;
                    slot := slot + 1;
                    CONTINUE;
                END IF;
            ELSE  -- the away reps' share is not consumed: serve the earliest deadline
                FOR i IN 1..k LOOP
                    CONTINUE WHEN i = excl OR blocked[i] IS NOT NULL;
                    dl := ((turns[i] + 1) * total + weights[i] - 1) / weights[i];
                    IF best IS NULL OR dl < best_dl THEN
                        best := i;
                        best_dl := dl;
                    END IF;
                END LOOP;
            END IF;
            EXIT;
        END LOOP;
        turns[best] := turns[best] + 1;
        shown[best] := shown[best] + 1;
        slot := slot + 1;
        IF room[best] IS NOT NULL THEN
            room[best] := room[best] - 1;
            IF room[best] = 0 THEN
                blocked[best] := 'capped';
                cred[best] := true;
                able := able - 1;
            END IF;
        END IF;
        IF max_in_a_row IS NOT NULL THEN
            hist := (ids[best] || hist)[1:max_in_a_row];
        END IF;
        picks := picks || ids[best];
    END LOOP;
    IF gave IS NOT NULL THEN
        FOR i IN 1..k LOOP
            IF gave[i] > 0 THEN
                credit_ids := credit_ids || ids[i];
                credit_ns := credit_ns || gave[i];
            END IF;
        END LOOP;
    END IF;
    RETURN ROW(picks, coalesce(skips, '{}'), coalesce(counts, '{}'), coalesce(credit_ids, '{}'),
               coalesce(credit_ns, '{}'));
END
$$;
