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
-- Leads given to their account's owner: the assignment (with the decision) and its outbox
-- row, in one statement. The member's rotation count is NOT bumped: a matched lead is not a
-- turn of the team's rotation.
WITH picks AS (
    SELECT *
    FROM unnest(CAST(:lead_ids AS bigint[]), CAST(:member_ids AS bigint[]),
                CAST(:team_ids AS bigint[]), CAST(:epochs AS integer[]),
                CAST(:rule_indexes AS integer[]), CAST(:rule_names AS text[]),
                CAST(:decisions AS text[]))
         AS p (lead_id, member_id, team_id, epoch, rule_index, rule_name, decision)
), assigned AS (
    INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                             rule_index, rule_name, source, account_match)
    SELECT p.lead_id, :org, p.team_id, p.member_id, m.crm_user_id, p.epoch,
           p.rule_index, p.rule_name, :source, p.decision::jsonb
    FROM picks p JOIN members m ON m.id = p.member_id
    RETURNING id, lead_id, crm_user_id
)
INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                    lead_received_at)
SELECT :org, assigned.lead_id, assigned.id, l.crm_object, l.crm_id, assigned.crm_user_id,
       l.parent_id, l.received_at
FROM assigned JOIN leads l ON l.id = assigned.lead_id
RETURNING lead_id

-- name: note_fallbacks
-- Why leads under an account_owner rule went to the rotation instead (their assignments were
-- just recorded by record_assignments in this transaction).
UPDATE assignments a SET account_match = t.decision::jsonb
FROM unnest(CAST(:lead_ids AS bigint[]), CAST(:decisions AS text[])) AS t (lead_id, decision)
WHERE a.lead_id = t.lead_id
