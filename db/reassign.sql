-- Named SQL for reassignment (`connector reassign`, rep deactivation, SLA re-route).
-- Lock order inside one transaction: the lead's current assignment row -> its unsent outbox
-- rows -> the team row of the rep who gets the lead (the same lock that serialises new
-- leads' rotation) -> [rotate_pick: route_team decides a rotation's pick] -> move_assignment
-- -> count_turns -> record_decisions -> COMMIT. The dispatcher claims
-- with SKIP LOCKED and finishes only rows still claimed by it, so a write replaced here is
-- never also recorded as sent.

-- name: lock_current
-- Only the assignment row is locked, and only through columns a reassignment never changes:
-- a waiter re-checks the row it waited for against its join quals, and a join on the
-- member or team would drop the row another reassignment just moved.
SELECT a.id
FROM leads l JOIN assignments a ON a.lead_id = l.id
WHERE l.org = :org AND l.crm_object = :crm_object AND l.crm_id = :crm_id
  AND l.merged_into IS NULL
FOR UPDATE OF a

-- name: current_of
-- Read after lock_current, in a new statement: it sees what a reassignment that committed
-- while we waited wrote.
SELECT a.id, a.lead_id, a.team_id, a.member_id, a.crm_user_id, a.epoch, a.reason,
       a.assigned_at, a.rule_index, t.name AS team, m.name AS owner_name
FROM assignments a
JOIN teams t ON t.id = a.team_id
JOIN members m ON m.id = a.member_id
WHERE a.id = :assignment_id

-- name: lead_state
SELECT l.id, l.unassigned_reason
FROM leads l
WHERE l.org = :org AND l.crm_object = :crm_object AND l.crm_id = :crm_id
  AND l.merged_into IS NULL

-- name: lock_unsent
SELECT id FROM outbox
WHERE lead_id = :lead_id AND state IN ('pending', 'claimed', 'dead')
ORDER BY id
FOR UPDATE

-- name: last_write
-- The lead's latest owner write; superseded with a found owner = a person moved the record.
SELECT id, state, owner_id, found_owner FROM outbox
WHERE lead_id = :lead_id ORDER BY id DESC LIMIT 1

-- name: lock_teams_by_id
-- Teams locked in name order, as routers, config applies and `rep away` lock them: a
-- reassignment's new team and its current one (whose row the history insert's foreign key
-- checks; the new team first and the old one after could deadlock with them), or the teams
-- of a rep being deactivated, before their members' rows.
SELECT id, name, epoch FROM teams WHERE id = ANY(CAST(:team_ids AS bigint[]))
ORDER BY name
FOR UPDATE

-- name: rep_candidates
-- Members of the org's configured teams whose crm_user_id or name is :rep (names compare
-- case-insensitively; :rep_key is the stored form of an id, Salesforce's 18 characters); the
-- caller decides (unknown, inactive, ambiguous).
SELECT m.id, m.team_id, t.name AS team, m.crm_user_id, m.name, m.active
FROM members m JOIN teams t ON t.id = m.team_id
WHERE t.org = :org AND t.in_config AND m.in_config
  AND (m.crm_user_id = :rep OR m.crm_user_id = CAST(:rep_key AS text)
       OR lower(m.name) = lower(:rep))
ORDER BY t.name, m.position

-- name: rotate_pick
-- The rotation's next rep for a lead being moved, decided by the router (route_team, the
-- team already locked here) with the current owner skipped, and not recorded: the move and
-- count_turns record it. Returns the pick (NULL: nobody else can take it now), the seats as
-- the decision records them, and the turns credited to reps passed over.
SELECT status, epoch, member_ids[1] AS member_id, reason, seat_ids, seat_users, seat_names,
       seat_weights, seat_skips, seat_counts, credit_ids, credit_ns
FROM route_team(
    CAST(:org AS text), CAST(:crm_object AS text), CAST(NULL AS text), CAST(:team AS text),
    CAST(:now AS timestamptz), CAST(:day AS date), CAST(:week AS date), CAST(NULL AS bigint),
    CAST(:users AS text[]), CAST(:blocked AS text[]), CAST(:per_day AS integer[]),
    CAST(:per_week AS integer[]), CAST(:team_per_day AS integer),
    CAST(:team_per_week AS integer), CAST(:max_in_a_row AS integer),
    ARRAY[CAST(:lead_id AS bigint)], CAST(NULL AS text[]), CAST(NULL AS text[]),
    CAST(NULL AS integer[]), CAST(NULL AS text[]), CAST(NULL AS integer[]),
    CAST(NULL AS jsonb), CAST(NULL AS integer[]), false, CAST(:exclude AS bigint), false)

-- name: count_turns
-- The move's turn: one more lead for the rep who gets it (the old rep's count stays: a lead
-- taken away is not owed back), its caps' counters, and the turns a rotation's pick credited
-- (db/functions/routing.sql count_turns, as for a new lead's pick).
SELECT count_turns(ARRAY[CAST(:member_id AS bigint)], CAST(:credit_ids AS bigint[]),
                   CAST(:credit_ns AS bigint[]), CAST(:day AS date), CAST(:week AS date))

-- name: move_assignment
-- One statement: the replaced owner goes to the history, the current row takes the new one,
-- every unsent write of the lead becomes superseded, and one new write is queued (the turn
-- is counted by count_turns). Its replaces_owners are the
-- owners our own earlier writes may have left in the CRM: the owner we last wrote (latest
-- sent row), writes in flight right now (claimed), and what the replaced unsent rows
-- carried. The caller locked those rows first (lock_unsent), so this statement's snapshot
-- sees their final states.
WITH cur AS (
    SELECT * FROM assignments WHERE id = :assignment_id
), hist AS (
    INSERT INTO assignment_history (assignment_id, lead_id, org, team_id, member_id,
                                    crm_user_id, epoch, reason, note, assigned_at,
                                    ended_reason)
    SELECT id, lead_id, org, team_id, member_id, crm_user_id, epoch, reason, note,
           assigned_at, :reason
    FROM cur
    RETURNING id
), prev AS (
    SELECT id, state, owner_id, replaces_owners FROM outbox
    WHERE lead_id = :lead_id AND state IN ('pending', 'claimed', 'dead')
), replaced AS (
    UPDATE outbox o
    SET state = 'superseded', finished_at = now(), lease_until = NULL,
        last_error = 'replaced by a reassignment (' || :reason || ') before it was sent'
    FROM prev
    WHERE o.id = prev.id
    RETURNING o.id
), carried AS (
    SELECT (SELECT owner_id FROM outbox
            WHERE lead_id = :lead_id AND state = 'sent'
            ORDER BY finished_at DESC NULLS LAST, id DESC LIMIT 1) AS owner
    UNION ALL SELECT owner_id FROM prev WHERE state = 'claimed'
    UNION ALL SELECT unnest(replaces_owners) FROM prev
    -- retention deleted the replaced owner's sent write: it is the owner we last wrote
    UNION ALL SELECT CAST(:old_owner AS text)
              WHERE NOT EXISTS (SELECT 1 FROM outbox
                                WHERE lead_id = :lead_id AND owner_id = :old_owner)
), moved AS (
    UPDATE assignments a
    SET team_id = :team_id, member_id = m.id, crm_user_id = m.crm_user_id, epoch = :epoch,
        reason = :reason, note = :note, assigned_at = now(), sla_due_at = NULL
    FROM members m
    WHERE a.id = :assignment_id AND m.id = :member_id
    RETURNING a.id, a.lead_id, a.crm_user_id
), notified AS (
    -- both reps' notifications (db/functions/notifications.sql; none when the org has none)
    SELECT queue_notifications(cur.org, ARRAY[cur.lead_id, cur.lead_id],
                               ARRAY[CAST(:member_id AS bigint), cur.member_id],
                               '{reassigned_to,reassigned_from}',
                               'moved:' || (SELECT id FROM hist),
                               jsonb_build_object('reason', CAST(:reason AS text))) AS n
    FROM cur
)
INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                    lead_received_at, replaces_owners)
SELECT l.org, moved.lead_id, moved.id, l.crm_object, l.crm_id, moved.crm_user_id, l.parent_id,
       l.received_at,
       COALESCE((SELECT array_agg(DISTINCT owner ORDER BY owner) FROM carried
                 WHERE owner IS NOT NULL AND owner <> moved.crm_user_id), '{}')
FROM moved JOIN leads l ON l.id = moved.lead_id
RETURNING id, replaces_owners, (SELECT count(*) FROM replaced) AS superseded,
          (SELECT count(*) FROM hist) AS archived,
          (SELECT sum(n) FROM notified) AS notified

-- name: deactivate_member
UPDATE members m SET active = false
FROM teams t
WHERE t.id = m.team_id AND t.org = :org AND t.in_config AND m.in_config
  AND m.crm_user_id = :crm_user_id
RETURNING m.id, m.team_id, t.name AS team

-- name: restart_epoch_edited
-- A rotation edit made by a command, not by the config: new epoch, counts restart, and the
-- fingerprint no longer matches any config, so the next apply of the YAML starts another.
WITH reset AS (
    UPDATE members SET assigned_in_epoch = 0 WHERE team_id = :team_id RETURNING id
)
UPDATE teams SET epoch = epoch + 1, fingerprint = 'edited-by-command', updated_at = now()
WHERE id = :team_id

-- name: unsent_of_inactive
-- Leads whose current owner cannot take leads now and whose owner write was not sent yet
-- (pending, in flight or dead): what a deactivation may re-route.
SELECT DISTINCT l.crm_id, a.crm_user_id
FROM assignments a
JOIN members m ON m.id = a.member_id
JOIN leads l ON l.id = a.lead_id
WHERE a.org = :org AND NOT (m.active AND m.in_config)
  AND (CAST(:crm_user_id AS text) IS NULL OR a.crm_user_id = :crm_user_id)
  AND EXISTS (SELECT 1 FROM outbox o
              WHERE o.lead_id = a.lead_id AND o.state IN ('pending', 'claimed', 'dead'))
ORDER BY l.crm_id

-- name: sla_due
SELECT a.id, a.lead_id, a.crm_user_id, a.rule_index, t.name AS team, l.crm_id,
       EXISTS (SELECT 1 FROM outbox o
               WHERE o.lead_id = a.lead_id AND o.state IN ('pending', 'claimed'))
           AS write_open
FROM assignments a
JOIN teams t ON t.id = a.team_id
JOIN leads l ON l.id = a.lead_id
WHERE a.org = :org AND a.sla_due_at IS NOT NULL AND a.sla_due_at <= :now
ORDER BY a.sla_due_at, a.id
LIMIT :limit

-- name: sla_done
-- The SLA check is over for these assignments (met, moved by a person, or gone), if they
-- still have the owner that was checked; its decision is recorded with it.
WITH d AS (
    SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:owners AS text[]),
                         CAST(:details AS text[]))
         AS d (id, owner, detail)
), cleared AS (
    UPDATE assignments a SET sla_due_at = NULL
    FROM d WHERE a.id = d.id AND a.crm_user_id = d.owner AND a.sla_due_at IS NOT NULL
    RETURNING a.id, a.lead_id
)
INSERT INTO routing_decisions (org, lead_id, kind, detail)
SELECT :org, cleared.lead_id, 'sla', d.detail::jsonb
FROM cleared JOIN d ON d.id = cleared.id
RETURNING lead_id

-- name: current_team
-- The team of a lead's current owner, read without a lock (`reassign --to` checks the rep it
-- would get the lead in before any lead moves; the move checks again under the lock).
SELECT a.team_id
FROM leads l JOIN assignments a ON a.lead_id = l.id
WHERE l.org = :org AND l.crm_object = :crm_object AND l.crm_id = :crm_id
  AND l.merged_into IS NULL
