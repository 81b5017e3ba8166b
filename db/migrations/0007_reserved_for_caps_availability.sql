-- Placeholder on branch h-matching only: version 7 belongs to h-caps'
-- 0007_caps_availability.sql, and db.migrations() requires versions 1..n without gaps.
-- DELETE THIS FILE (and its row in schema.sql) when merging; 0008_accounts.sql follows 0007.
SELECT 1;
