-- 0015_queue_autovacuum.sql
-- The queue tables turn every row over two or three times within seconds (pending, claimed,
-- done/sent). With the default trigger (a fifth of the table dead, throttled by cost_delay),
-- hundreds of thousands of dead versions pile up at the head of their pending indexes before
-- autovacuum starts, and every claim steps over them. Vacuum them after a fixed number of
-- dead rows, without throttling. (None of this helps while a snapshot is held open: no
-- vacuum can remove a version an open snapshot may still see; see BENCHMARKS.md.)
ALTER TABLE intake_events SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
