-- Placeholder on branch h-dashboard only: version 9 belongs to another branch's migration,
-- and db.migrations() requires versions 1..n without gaps (the dashboard's is 0010).
-- DELETE THIS FILE (and its row in schema.sql) when merging.
SELECT 1;
