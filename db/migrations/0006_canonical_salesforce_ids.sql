-- One lead per Salesforce record: ids are stored in their 18-character form.
-- A record ingested by its 15-character id (what reports export) and received again by its
-- 18-character id (what the APIs send) used to become two leads, two assignments and two
-- owner writes. This converts every Salesforce lead and outbox row (crm_object Lead or
-- Contact; HubSpot's are contacts and leads) to the 18-character form and merges the leads
-- that then name the same record: the one assigned first (or, none assigned, the lowest id)
-- wins; the others keep their rows for the audit but point at the winner (merged_into), their
-- unsent owner writes are superseded, and their assignments leave the rotation counts.

-- The 18-character form of a 15- or 18-character Salesforce id; anything else unchanged.
-- An 18-character id's own suffix decides the case of its first 15 characters (it may have
-- been case-folded on the way). Case is changed with translate(), not upper()/lower(), so the
-- database's collation cannot matter.
CREATE FUNCTION salesforce_id_18(value text) RETURNS text
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

ALTER TABLE leads ADD COLUMN merged_into bigint REFERENCES leads (id);
ALTER TABLE leads DROP CONSTRAINT leads_org_crm_object_crm_id_key;

-- Merge: every lead that names the same record as an earlier one points at that winner.
WITH ranked AS (
    SELECT l.id AS lead_id,
           first_value(l.id) OVER (
               PARTITION BY l.org, l.crm_object, salesforce_id_18(l.crm_id)
               ORDER BY a.assigned_at NULLS LAST, l.id
           ) AS winner_id
    FROM leads l LEFT JOIN assignments a ON a.lead_id = l.id
    WHERE l.crm_object IN ('Lead', 'Contact')
), losers AS (
    SELECT lead_id, winner_id FROM ranked WHERE lead_id <> winner_id
), merged AS (
    UPDATE leads l SET merged_into = losers.winner_id
    FROM losers WHERE l.id = losers.lead_id
    RETURNING l.id
), superseded AS (
    UPDATE outbox o
    SET state = 'superseded',
        last_error = 'merged into lead ' || losers.winner_id
                     || ': same record by its 15- and 18-character ids',
        finished_at = now(),
        lease_until = NULL
    FROM losers
    WHERE o.lead_id = losers.lead_id AND o.state <> 'sent'
    RETURNING o.id
), uncounted AS (
    -- a loser's assignment made in its team's current epoch counted for a rep it never was
    SELECT a.member_id, count(*) AS n
    FROM losers
    JOIN assignments a ON a.lead_id = losers.lead_id
    JOIN teams t ON t.id = a.team_id AND t.epoch = a.epoch
    GROUP BY a.member_id
), decremented AS (
    UPDATE members m SET assigned_in_epoch = greatest(m.assigned_in_epoch - uncounted.n, 0)
    FROM uncounted WHERE m.id = uncounted.member_id
    RETURNING m.id
)
SELECT (SELECT count(*) FROM merged), (SELECT count(*) FROM superseded),
       (SELECT count(*) FROM decremented);

UPDATE leads
SET crm_id = salesforce_id_18(crm_id), parent_id = salesforce_id_18(parent_id)
WHERE crm_object IN ('Lead', 'Contact')
  AND (crm_id IS DISTINCT FROM salesforce_id_18(crm_id)
       OR parent_id IS DISTINCT FROM salesforce_id_18(parent_id));

UPDATE outbox
SET crm_id = salesforce_id_18(crm_id), parent_id = salesforce_id_18(parent_id)
WHERE crm_object IN ('Lead', 'Contact')
  AND (crm_id IS DISTINCT FROM salesforce_id_18(crm_id)
       OR parent_id IS DISTINCT FROM salesforce_id_18(parent_id));

-- One live lead per record; merged leads stay for the audit.
CREATE UNIQUE INDEX leads_live_crm_id ON leads (org, crm_object, crm_id) WHERE merged_into IS NULL;

-- Pushed events and skip records name Salesforce records the same way.
UPDATE intake_events SET crm_id = salesforce_id_18(crm_id)
WHERE source = 'salesforce_outbound' AND crm_id IS DISTINCT FROM salesforce_id_18(crm_id);
DELETE FROM skipped_records s
WHERE s.crm_object IN ('Lead', 'Contact') AND s.crm_id <> salesforce_id_18(s.crm_id)
  AND EXISTS (SELECT 1 FROM skipped_records o
              WHERE o.org = s.org AND o.crm_object = s.crm_object
                AND o.crm_id = salesforce_id_18(s.crm_id));
UPDATE skipped_records SET crm_id = salesforce_id_18(crm_id)
WHERE crm_object IN ('Lead', 'Contact') AND crm_id <> salesforce_id_18(crm_id);
