-- Named SQL for each rep's state now and its recent picks (connector/shell/availability.py:
-- `connector status`, `connector rep list`, the dashboard). The members' seats are read with
-- routing.sql team_candidates, the time off with reps.sql time_off, the leads of a window with
-- dashboard.sql window_counts.

-- name: teams
SELECT id, name FROM teams WHERE org = :org AND in_config ORDER BY name

-- name: recent_skips
-- Per member and skip reason (NULL: eligible), in how many of the org's latest rotation
-- picks since :since it was a seat: at most :limit picks, newest first down the made_at
-- index (a pick records its seats and their skips in columns, db/functions/routing.sql
-- record_assignments; reassignments and account owners' leads keep theirs in detail and are
-- not counted).
WITH recent AS (
    SELECT seat_ids, seat_skips
    FROM routing_decisions
    WHERE org = :org AND made_at >= :since AND seat_ids IS NOT NULL
    ORDER BY made_at DESC
    LIMIT :limit
)
SELECT s.member_id, s.skip, count(*) AS n
FROM recent CROSS JOIN LATERAL unnest(recent.seat_ids, recent.seat_skips) AS s (member_id, skip)
GROUP BY s.member_id, s.skip
