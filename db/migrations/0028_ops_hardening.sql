-- One CRM API budget per org shared by every process, and Salesforce ids stored in their
-- 18-character form in the tables that could still hold a 15-character one.

-- The org's CRM call budget (connector/core/budget.py): the send times of its calls in the
-- last window, oldest first. Every process takes its calls from this row, in one statement,
-- so N processes together keep one budget.
CREATE TABLE crm_budgets (
    org        text PRIMARY KEY,
    calls      timestamptz[] NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Record and owner ids of skips and pushed events written before every entry point stored
-- the 18-character form (an import by 15-character id stored that form). Only ids of the
-- Salesforce shape change (HubSpot ids are numbers without leading zeros); a skip already
-- stored under the 18-character form keeps that row. salesforce_id_18 comes from
-- db/functions/ids.sql, applied after the migrations: a database created by this release
-- has no rows to change and no such function yet.
DO $$
BEGIN
    IF to_regprocedure('salesforce_id_18(text)') IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM skipped_records s
    WHERE s.crm_id ~ '^00[A-Za-z0-9]{13}$'
      AND EXISTS (
          SELECT 1 FROM skipped_records c
          WHERE c.org = s.org AND c.crm_object = s.crm_object
            AND c.crm_id = salesforce_id_18(s.crm_id));
    UPDATE skipped_records SET crm_id = salesforce_id_18(crm_id)
    WHERE crm_id ~ '^00[A-Za-z0-9]{13}$';
    UPDATE skipped_records SET owner_found = salesforce_id_18(owner_found)
    WHERE owner_found ~ '^00[A-Za-z0-9]{13}$';
    UPDATE intake_events SET crm_id = salesforce_id_18(crm_id)
    WHERE source = 'salesforce_outbound' AND crm_id ~ '^00[A-Za-z0-9]{13}$';
END
$$;
