-- 0027_validate_member_keys.sql
-- Validates 0026's foreign key from assignments to member_keys: a scan of the stored
-- assignments, in a transaction of its own, under a lock (SHARE UPDATE EXCLUSIVE on
-- assignments, ROW SHARE on member_keys) that lets routing read and write meanwhile.
ALTER TABLE assignments VALIDATE CONSTRAINT assignments_member_id_fkey;
