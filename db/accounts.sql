-- Named SQL for lead-to-account matching: the account mirror (refreshed by the poll) and the
-- lookups and records made while routing.

-- name: watermark
SELECT watermark FROM account_watermarks WHERE org = :org

-- name: advance
INSERT INTO account_watermarks (org, watermark) VALUES (:org, :watermark)
ON CONFLICT (org) DO UPDATE
SET watermark = GREATEST(account_watermarks.watermark, EXCLUDED.watermark), updated_at = now()

-- name: upsert_accounts
-- A page of accounts as the CRM has them now. A row is only replaced by one at least as new
-- (the poll's overlap re-reads are harmless); the ids of the rows written come back.
INSERT INTO crm_accounts AS a (org, crm_id, owner_id, modified_at)
SELECT :org, t.crm_id, t.owner_id, t.modified_at
FROM unnest(CAST(:crm_ids AS text[]), CAST(:owner_ids AS text[]),
            CAST(:modified AS timestamptz[])) AS t (crm_id, owner_id, modified_at)
ORDER BY t.crm_id
ON CONFLICT (org, crm_id) DO UPDATE
SET owner_id = EXCLUDED.owner_id, modified_at = EXCLUDED.modified_at, synced_at = now()
WHERE a.modified_at <= EXCLUDED.modified_at
RETURNING a.crm_id

-- name: clear_domains
DELETE FROM crm_account_domains WHERE org = :org AND crm_id = ANY(CAST(:crm_ids AS text[]))

-- name: insert_domains
INSERT INTO crm_account_domains (org, domain, crm_id)
SELECT :org, t.domain, t.crm_id
FROM unnest(CAST(:domains AS text[]), CAST(:crm_ids AS text[])) AS t (domain, crm_id)
ON CONFLICT DO NOTHING

-- name: match_lookup
-- Everything one batch's matching needs, in one round trip: the accounts its leads name as
-- parent ('account'), the accounts of its leads' domains ('domain'), and every member row of
-- the org's configured teams ('rep': who may own a matched lead).
SELECT 'account' AS kind, NULL::text AS domain, a.crm_id, a.owner_id, a.modified_at,
       NULL::bigint AS member_id, NULL::text AS crm_user_id, NULL::text AS name,
       NULL::boolean AS active, NULL::bigint AS team_id, NULL::text AS team,
       NULL::integer AS epoch, NULL::integer AS position
FROM crm_accounts a
WHERE a.org = :org AND a.crm_id = ANY(CAST(:crm_ids AS text[]))
UNION ALL
SELECT 'domain', d.domain, a.crm_id, a.owner_id, a.modified_at,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM crm_account_domains d
JOIN crm_accounts a ON a.org = d.org AND a.crm_id = d.crm_id
WHERE d.org = :org AND d.domain = ANY(CAST(:domains AS text[]))
UNION ALL
SELECT 'rep', NULL, NULL, NULL, NULL,
       m.id, m.crm_user_id, m.name, m.active, t.id, t.name, t.epoch, m.position
FROM members m JOIN teams t ON t.id = m.team_id
WHERE t.org = :org AND t.in_config AND m.in_config

-- name: record_matched
-- Leads of one team given to their account's owner, recorded by record_assignments: the
-- assignment (with the account decision) and its outbox row. p_turns is false: a matched
-- lead is no turn of the team's rotation (no count, credit or caps counter moves); its
-- routing decision is recorded with the batch's others (decisions.sql).
SELECT record_assignments(
    CAST(:org AS text), CAST(:crm_object AS text), CAST(:source AS text),
    CAST(:team_id AS bigint), CAST(:epoch AS integer), false, CAST(NULL AS date),
    CAST(NULL AS date), CAST(:lead_ids AS bigint[]), CAST(:member_ids AS bigint[]),
    CAST(:owner_ids AS text[]), CAST(:crm_ids AS text[]), CAST(:parent_ids AS text[]),
    CAST(:rule_indexes AS integer[]), CAST(:rule_names AS text[]), CAST(NULL AS integer[]),
    CAST(:decisions AS jsonb),
    CAST(NULL AS bigint[]), CAST(NULL AS bigint[]), CAST(NULL AS bigint), CAST(NULL AS jsonb),
    CAST(NULL AS integer[]), CAST(NULL AS bigint[]), CAST(NULL AS integer[]),
    CAST(NULL AS text[]), CAST(NULL AS bigint[]), CAST(NULL AS text))

-- name: note_fallbacks
-- Why leads under an account_owner rule went to the rotation instead (their assignments were
-- just recorded by route_team in this transaction).
UPDATE assignments a SET account_match = t.decision::jsonb
FROM unnest(CAST(:lead_ids AS bigint[]), CAST(:decisions AS text[])) AS t (lead_id, decision)
WHERE a.lead_id = t.lead_id
