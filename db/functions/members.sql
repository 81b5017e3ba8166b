-- Members' side tables kept by trigger (db/functions/: applied on every migrate, see
-- connector/shell/migrations.py apply_functions).

-- Every new member gets its row in member_keys, the never-updated table that assignments'
-- foreign key checks (a members row is updated by every batch that picks its rep, and
-- behind a held snapshot a key's check per assigned lead would walk all of its versions).
CREATE OR REPLACE FUNCTION members_add_key() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO member_keys (id) VALUES (NEW.id);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER members_add_key
AFTER INSERT ON members
FOR EACH ROW EXECUTE FUNCTION members_add_key();
