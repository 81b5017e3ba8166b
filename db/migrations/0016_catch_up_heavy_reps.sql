-- 0016_catch_up_heavy_reps.sql
-- catch_up {max_in_a_row: K} no longer applies to a rep whose weighted share is more than K
-- of every K+1 leads (weights 1, 1, 5 with K = 1): such a rep needs longer runs for its share
-- alone, and refusing it a (K+1)-th lead in a row while it was at or below its share kept it
-- below its share for ever after anyone's time away (found by Hypothesis). rotation_pick
-- mirrors connector/routing/rotation.py `limits_runs`; `check-config` says when K does not
-- apply. Only the exclusion test changes.
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
