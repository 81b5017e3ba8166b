-- 0026_member_keys.sql
-- An assignment's member is checked against member_keys, a table of the members' ids that
-- is never updated, instead of against members, whose rows every routed batch updates (the
-- picked reps' turns). The foreign key's check of each inserted assignment (SELECT 1 FROM
-- ... WHERE id = $1 FOR KEY SHARE) has to find the version of the row it may see. While a
-- snapshot is held open (a long report, a forgotten BEGIN) no version of a members row can
-- be pruned, so each check walked every version of its member written since the snapshot
-- began: for a batch of 200 leads of one team, 200 walks of the same ten ever-longer chains,
-- most of the batch's growing cost behind a held snapshot (BENCHMARKS.md, "A snapshot held
-- open"). A member_keys row keeps one version (a FOR KEY SHARE lock is marked on the row in
-- place), so the same check finds it at once.
-- The chain of foreign keys keeps what assignments_member_id_fkey guaranteed, under the same
-- name, with a lock of the same strength taken on the key's row instead of the member's: an
-- assignment names a member_keys row, which names a members row. Deleting a member deletes
-- its key (ON DELETE CASCADE), which the assignments that name it refuse, so the
-- assignments' key refuses a delete exactly as before (and a new id, ON UPDATE CASCADE). A
-- key is added with each new member, by trigger.
-- Every table this changes is locked first, in one statement, so that the migration never
-- waits for a lock while holding another (a router between its read of the seats and its
-- update of members would deadlock with it); routing waits for the migration, which scans
-- nothing: the key is added NOT VALID, and 0027 validates it while routing goes on. The lock
-- on members also keeps a member from being added between the copy of the ids below and
-- the trigger.
LOCK TABLE members, assignments IN ACCESS EXCLUSIVE MODE;

CREATE TABLE member_keys (
    id bigint PRIMARY KEY REFERENCES members (id) ON DELETE CASCADE ON UPDATE CASCADE
);

INSERT INTO member_keys (id) SELECT id FROM members;

CREATE FUNCTION members_add_key() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO member_keys (id) VALUES (NEW.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER members_add_key
AFTER INSERT ON members
FOR EACH ROW EXECUTE FUNCTION members_add_key();

-- Checked for every assignment written from now on; the ones already stored are validated
-- by 0027.
ALTER TABLE assignments
    DROP CONSTRAINT assignments_member_id_fkey,
    ADD CONSTRAINT assignments_member_id_fkey FOREIGN KEY (member_id) REFERENCES member_keys (id)
        NOT VALID;
