-- Salesforce ids in their canonical form (db/functions/: applied on every migrate, see
-- connector/shell/migrations.py apply_functions).

-- The 18-character form of a 15- or 18-character Salesforce id; anything else unchanged.
-- An 18-character id's own suffix decides the case of its first 15 characters (it may have
-- been case-folded on the way). Case is changed with translate(), not upper()/lower(), so the
-- database's collation cannot matter.
CREATE OR REPLACE FUNCTION salesforce_id_18(value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    alphabet constant text := 'ABCDEFGHIJKLMNOPQRSTUVWXYZ012345';
    lowers   constant text := 'abcdefghijklmnopqrstuvwxyz';
    uppers   constant text := 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';
    id15     text := '';
    suffix   text := '';
    ch       text;
    bits     integer;
BEGIN
    IF value !~ '^[A-Za-z0-9]{15}([A-Za-z0-9]{3})?$' THEN
        RETURN value;
    END IF;
    IF length(value) = 15 THEN
        id15 := value;
    ELSE
        FOR chunk IN 0..2 LOOP
            bits := strpos(alphabet, translate(substr(value, 16 + chunk, 1), lowers, uppers)) - 1;
            IF bits < 0 THEN
                RETURN value;  -- not a suffix character
            END IF;
            FOR i IN 0..4 LOOP
                ch := substr(value, chunk * 5 + i + 1, 1);
                IF (bits >> i) & 1 = 1 THEN
                    IF ch ~ '^[0-9]$' THEN
                        RETURN value;  -- the suffix marks a digit upper case
                    END IF;
                    id15 := id15 || translate(ch, lowers, uppers);
                ELSE
                    id15 := id15 || translate(ch, uppers, lowers);
                END IF;
            END LOOP;
        END LOOP;
    END IF;
    FOR chunk IN 0..2 LOOP
        bits := 0;
        FOR i IN 0..4 LOOP
            IF strpos(uppers, substr(id15, chunk * 5 + i + 1, 1)) > 0 THEN
                bits := bits | (1 << i);
            END IF;
        END LOOP;
        suffix := suffix || substr(alphabet, bits + 1, 1);
    END LOOP;
    RETURN id15 || suffix;
END
$$;
