-- Named SQL for `connector simulate` (read-only: run in a READ ONLY transaction).

-- name: history
-- The org's stored leads received since :since, with what routing decided when each arrived:
-- a lead reassigned since (reassign, rep deactivation, SLA) is given its first owner, the one
-- its assignment row had before the first reassignment (the row keeps its id, so its place in
-- the team's lock order). Merged copies (a second id form of one record) are left out: their
-- winner stands for them. From the lead's routing decision (routing_decisions, kind 'route'):
-- the instant availability was judged at and the batch (recorded since the replay uses them;
-- NULL for older decisions), the team that decided, the teams it overflowed from, whether its
-- account's owner got it, and the reps away by `connector rep away` then (older decisions,
-- which do not name those: every rep skipped as away).
SELECT l.id AS lead_id, l.crm_id, l.fields, l.received_at, l.unassigned_reason, l.parent_id,
       a.id AS assignment_id, COALESCE(t.name, d.team) AS team,
       COALESCE(f.crm_user_id, a.crm_user_id) AS owner, COALESCE(f.epoch, a.epoch) AS epoch,
       (f.crm_user_id IS NOT NULL) AS reassigned, ct.name AS current_team,
       d.id AS decision_id, d.at, d.batch, d.overflow_from, d.by_account, d.away
FROM leads l
LEFT JOIN assignments a ON a.lead_id = l.id
LEFT JOIN LATERAL (
    SELECT h.team_id, h.crm_user_id, h.epoch
    FROM assignment_history h WHERE h.lead_id = l.id ORDER BY h.id LIMIT 1
) f ON true
LEFT JOIN LATERAL (
    -- routing_decisions itself, not decision_details: every key read here is in detail,
    -- except a column-stored pick's batch; the view would rebuild the whole
    -- detail for each key read
    SELECT r.id, r.detail ->> 'at' AS at,
           COALESCE(r.batch, (r.detail ->> 'batch')::bigint) AS batch,
           r.detail ->> 'team' AS team,
           CASE WHEN r.detail ? 'overflow_from'
                THEN jsonb_path_query_array(r.detail, '$.overflow_from[*].team')
           END AS overflow_from,
           (r.detail -> 'chosen' ->> 'by') IS NOT DISTINCT FROM 'account_owner' AS by_account,
           CASE WHEN r.detail ? 'at' THEN COALESCE(r.detail -> 'away_by_command', '[]')
                ELSE jsonb_path_query_array(
                         r.detail, '$.candidates[*] ? (@.skip == "away").crm_user_id')
                     || jsonb_path_query_array(
                         r.detail,
                         '$.overflow_from[*].candidates[*] ? (@.skip == "away").crm_user_id')
           END AS away
    FROM routing_decisions r
    WHERE r.lead_id = l.id AND r.kind = 'route'
    ORDER BY r.id LIMIT 1
) d ON true
LEFT JOIN teams t ON t.id = COALESCE(f.team_id, a.team_id)
LEFT JOIN teams ct ON ct.id = a.team_id
WHERE l.org = :org AND l.merged_into IS NULL AND l.received_at >= :since
ORDER BY l.received_at, l.id

-- name: first_decisions
-- The routing decisions of the given leads (each team's first decision of the window): the
-- candidates' counts in them are the rotation's turns (leads + credited turns) at that pick.
SELECT lead_id, detail FROM decision_details
WHERE lead_id = ANY(CAST(:lead_ids AS bigint[])) AND kind = 'route'
ORDER BY id

-- name: members
-- Who the member ids of compactly recorded picks are (connector/routing/decisions.py `expand`).
SELECT id, crm_user_id, name FROM members WHERE id = ANY(CAST(:ids AS bigint[]))

-- name: loads_before
-- The caps' counts at the window's start: the leads the rotation gave each rep (account
-- owners' leads do not count, as when routing) among the leads received in the 8 days before
-- the window, by the local day of the instant they were judged at in the (proposed) team's zone.
-- Reassignments, which also count toward the caps, are not included.
SELECT z.team, r.crm_user_id, (r.at AT TIME ZONE z.tz)::date AS day, count(*) AS n
FROM (
    -- the pick: a full record names the rep, a compact one its member id, in
    -- detail or in a column; routing_decisions itself, not decision_details,
    -- which would rebuild the whole detail for each key read
    SELECT d.detail ->> 'team' AS team,
           COALESCE(d.detail -> 'chosen' ->> 'crm_user_id', m.crm_user_id) AS crm_user_id,
           COALESCE((d.detail ->> 'at')::timestamptz, l.received_at) AS at
    FROM leads l
    JOIN routing_decisions d ON d.lead_id = l.id AND d.kind = 'route'
    LEFT JOIN members m ON m.id = COALESCE(d.chosen_id, CAST(d.detail ->> 'chosen_id' AS bigint))
    WHERE l.org = :org AND l.merged_into IS NULL
      AND l.received_at < :since AND l.received_at >= :since - interval '8 days'
      AND d.detail ->> 'outcome' = 'assigned'
      AND (d.detail -> 'chosen' ->> 'by') IS DISTINCT FROM 'account_owner'
) r
JOIN unnest(CAST(:teams AS text[]), CAST(:zones AS text[])) AS z (team, tz) ON z.team = r.team
GROUP BY 1, 2, 3

-- name: recent_before
-- Each catch-up team's latest owners before the window, newest first (what the router's
-- recent_owners read when the window began).
SELECT t.name AS team, r.crm_user_id
FROM teams t
CROSS JOIN LATERAL (
    SELECT a.id, a.crm_user_id
    FROM assignments a JOIN leads l ON l.id = a.lead_id
    WHERE a.team_id = t.id AND l.received_at < :since
    ORDER BY a.id DESC LIMIT :k
) r
WHERE t.org = :org AND t.name = ANY(CAST(:teams AS text[]))
ORDER BY t.name, r.id DESC

-- name: accounts
-- The account mirror as it is now, for the leads of `route_to: account_owner` rules: the
-- accounts they name as parent ('account') and the accounts of their domains ('domain').
SELECT 'account' AS kind, NULL::text AS domain, a.crm_id, a.owner_id, a.modified_at
FROM crm_accounts a
WHERE a.org = :org AND a.crm_id = ANY(CAST(:crm_ids AS text[]))
UNION ALL
SELECT 'domain', d.domain, a.crm_id, a.owner_id, a.modified_at
FROM crm_account_domains d
JOIN crm_accounts a ON a.org = d.org AND a.crm_id = d.crm_id
WHERE d.org = :org AND d.domain = ANY(CAST(:domains AS text[]))

-- name: teams
-- Each team's rotation as the database has it now: epoch, fingerprint and members.
SELECT t.id AS team_id, t.name AS team, t.epoch, t.fingerprint, m.crm_user_id, m.name
FROM teams t JOIN members m ON m.team_id = t.id
WHERE t.org = :org
ORDER BY t.name, m.position, m.crm_user_id

-- name: counts_before
-- How many leads each member received in its team's epoch before the window: the rotation
-- state the replay starts from when a team's rotation is unchanged. Every version of an
-- assignment is one lead received (the routed one, and each reassignment, which counts for
-- the rep who got the lead and is never taken back from the one who lost it).
SELECT t.name AS team, v.epoch, v.crm_user_id, count(*) AS n
FROM (
    SELECT lead_id, team_id, epoch, crm_user_id FROM assignments WHERE org = :org
    UNION ALL
    SELECT lead_id, team_id, epoch, crm_user_id FROM assignment_history WHERE org = :org
) v
JOIN teams t ON t.id = v.team_id
JOIN leads l ON l.id = v.lead_id
WHERE l.merged_into IS NULL AND l.received_at < :since
GROUP BY t.name, v.epoch, v.crm_user_id
