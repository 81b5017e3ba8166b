-- 0021_route_plain_one_pass.sql
-- route_plain (migration 0020), same decisions and records, cheaper, most of all when leads
-- queue for their team's lock. Still one call, so one round trip; now two statements:
-- * The first stores the lead and takes the team's lock, as 0020 did (a repeat, a team not
--   in the database, a rep of the team away by command: nothing written, status
--   'route_lead', checked in the snapshot taken before the wait, as before).
-- * The second is a new statement of this VOLATILE function, so it takes a fresh snapshot
--   after the lock: it reads the members and the time off set by command as the previous
--   lock holder committed them, with no row lock on any member. 0020 read
--   the members in the same statement as the lock, through share locks, which re-read each
--   row at its newest version: ten members meant ten tuple locks (and their WAL) per lead,
--   taken while the team's lock is held, and a team row version to compare because a row
--   the old snapshot cannot see (a member added by a config apply) is never returned.
-- * One pass over the seats gives the rotation's totals and the decision's arrays (the
--   active seats in rotation order, heavier first, then position, then id; the inactive
--   members after them by position), and the pick is one ordered read of the active seats:
--   released seats (turns * total / weight <= the turns given so far) before the others,
--   then the earliest deadline, then rotation order. That is rotation_pick_plain's
--   ordering (route_lead still uses it); tests/test_route_lead.py checks the two against
--   each other with Hypothesis. 0020 gathered the active seats into arrays for
--   rotation_pick_plain, which unnests them, numbers them with a window and sorts them
--   three times, then gathered the inactive members apart and joined the two.
-- * When the lead must go to route_lead after all (a rep of the team went away by command
--   while the lead waited, or the team has no active member, which route_lead records as
--   unassigned), the second statement writes nothing and the lead row the first stored is
--   deleted, in this transaction, under the team's lock: no exception block, so no
--   subtransaction and no second transaction id on any call. A team with no active member
--   at all is seen before the lead is stored (as a rep away is), so its leads go straight
--   to route_lead. The delete's check of leads.merged_into (the self-reference) needs an
--   index of its own: the only one holding that column leads with org, so PostgreSQL 15
--   scanned the whole index, 3.3 ms a delete at 3 million leads, while the team's lock is
--   held (leads_merged_into below: 0.03 ms).
-- Measured with pgbench (prepared, the server on 127.0.0.1, fsync on, two alternating runs
-- each), ms a call at 1 / 4 / 16 clients: 0020 0.81 / 3.40 / 18.4, this 0.70 / 2.69 / 13.2
-- before the check for an active member was added; with it, later in the same (grown)
-- database: 0.87 / 3.56 / 19.8 and 0.77 / 2.82 / 13.1.
CREATE OR REPLACE FUNCTION route_plain(
    p_org text, p_crm_object text, p_source text, p_crm_id text, p_fields jsonb,
    p_parent_id text, p_team text, p_rule_index integer, p_rule_name text,
    p_now timestamptz, p_day date, p_week date, p_detail jsonb, p_sla_minutes integer
)
RETURNS TABLE (
    status text, lead_id bigint, team text, owner_id text, owner_name text, reason text,
    cand_ids bigint[], cand_skips text[]
)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    l record;
    r record;
BEGIN
    team := p_team;
    status := 'route_lead';
    WITH snap AS (
        SELECT t.id FROM teams t
        WHERE t.org = p_org AND t.name = p_team AND t.in_config
          -- an active member (route_lead records a lead of a team without one unassigned)
          AND EXISTS (SELECT FROM members am
                      WHERE am.team_id = t.id AND am.active AND am.in_config)
          -- no rep of the team away by command at p_now (read from the org's time off,
          -- which is usually empty, not from the team's members)
          AND NOT EXISTS (
              SELECT FROM rep_time_off o
              WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until
                AND EXISTS (SELECT FROM members mb
                            WHERE mb.team_id = t.id AND mb.crm_user_id = o.crm_user_id
                              AND mb.in_config))
    ), lead AS (
        INSERT INTO leads (org, crm_object, crm_id, fields, parent_id, source)
        SELECT p_org, p_crm_object, p_crm_id, p_fields, p_parent_id, p_source FROM snap
        ON CONFLICT (org, crm_object, crm_id) WHERE merged_into IS NULL DO NOTHING
        RETURNING id, received_at
    ), locked AS (
        -- in_config is checked again on the row's newest version: a team a config apply
        -- retired while the lead waited is not locked
        SELECT t.id, t.epoch FROM teams t
        WHERE t.id = (SELECT snap.id FROM snap) AND t.in_config AND EXISTS (SELECT FROM lead)
        FOR UPDATE
    )
    SELECT lead.id, lead.received_at, locked.id AS team_id, locked.epoch
    FROM lead LEFT JOIN locked ON true
    INTO l;
    IF l.id IS NULL THEN  -- nothing written
        RETURN NEXT;
        RETURN;
    END IF;
    -- A new statement: a fresh snapshot, taken with the team's lock held.
    WITH seat AS (
        SELECT m.id, m.weight, m.assigned_in_epoch + m.credited_in_epoch AS turns, m.position,
               m.active, m.crm_user_id, m.name
        FROM members m
        WHERE m.team_id = l.team_id AND m.in_config
    ), seats AS (
        -- the rotation's totals over the active seats, and every member as the decision
        -- records it: the active seats in rotation order, then the inactive ones
        SELECT CAST(sum(s.weight) FILTER (WHERE s.active) AS bigint) AS w,
               CAST(sum(s.turns) FILTER (WHERE s.active) AS bigint) AS slot,
               array_agg(s.id ORDER BY NOT s.active, CASE WHEN s.active THEN -s.weight END,
                                       s.position, s.id) AS ids,
               array_agg(CASE WHEN NOT s.active THEN 'inactive' END
                         ORDER BY NOT s.active, CASE WHEN s.active THEN -s.weight END,
                                  s.position, s.id) AS skips,
               array_agg(s.weight ORDER BY NOT s.active, CASE WHEN s.active THEN -s.weight END,
                                           s.position, s.id) AS weights,
               array_agg(s.turns ORDER BY NOT s.active, CASE WHEN s.active THEN -s.weight END,
                                          s.position, s.id) AS turns
        FROM seat s
    ), chosen AS (
        SELECT s.id, s.crm_user_id, s.name
        FROM seat s, seats
        WHERE s.active
          -- a rep of the team away by command now (stored while the lead waited): route_lead
          -- decides the lead
          AND NOT EXISTS (
              SELECT FROM rep_time_off o JOIN seat mb ON mb.crm_user_id = o.crm_user_id
              WHERE o.org = p_org AND o.starts_at <= p_now AND p_now < o.until)
        ORDER BY s.turns * seats.w / s.weight > seats.slot,
                 ((s.turns + 1) * seats.w + s.weight - 1) / s.weight,
                 s.weight DESC, s.position, s.id
        LIMIT 1
    ), bump AS (
        UPDATE members mb SET assigned_in_epoch = mb.assigned_in_epoch + 1
        FROM chosen WHERE mb.id = chosen.id
        RETURNING mb.id
    ), load AS (
        INSERT INTO member_load (member_id, period, starts_on, assigned)
        SELECT chosen.id, k.period, k.starts_on, 1
        FROM chosen
        CROSS JOIN (VALUES ('day', p_day), ('week', p_week)) AS k (period, starts_on)
        ON CONFLICT (member_id, period, starts_on)
        DO UPDATE SET assigned = member_load.assigned + 1
        RETURNING member_id
    ), assigned AS (
        INSERT INTO assignments (lead_id, org, team_id, member_id, crm_user_id, epoch,
                                 rule_index, rule_name, source, sla_due_at)
        SELECT l.id, p_org, l.team_id, chosen.id, chosen.crm_user_id, l.epoch,
               p_rule_index, p_rule_name, p_source,
               now() + make_interval(mins => p_sla_minutes)
        FROM chosen
        RETURNING id
    ), queued AS (
        INSERT INTO outbox (org, lead_id, assignment_id, crm_object, crm_id, owner_id, parent_id,
                            lead_received_at)
        SELECT p_org, l.id, assigned.id, p_crm_object, p_crm_id, chosen.crm_user_id,
               p_parent_id, l.received_at
        FROM assigned, chosen
        RETURNING id
    ), decided AS (
        INSERT INTO routing_decisions (org, lead_id, kind, detail)
        SELECT p_org, l.id, 'route',
               p_detail
               || jsonb_build_object(
                      'batch', l.id, 'team', p_team,
                      'seats', jsonb_build_object('ids', seats.ids, 'weights', seats.weights,
                                                  'counts', seats.turns, 'skips', seats.skips),
                      'epoch', l.epoch, 'outcome', 'assigned', 'chosen_id', chosen.id)
               || CASE WHEN p_sla_minutes IS NULL THEN CAST('{}' AS jsonb)
                       ELSE jsonb_build_object('sla_minutes', p_sla_minutes) END
        FROM chosen, seats
        RETURNING lead_id
    )
    SELECT chosen.crm_user_id AS owner_id, chosen.name AS owner_name, seats.ids, seats.skips,
           (SELECT count(*) FROM decided) AS decided
    FROM chosen, seats
    INTO r;
    IF r.decided IS DISTINCT FROM 1 THEN
        -- nothing but the lead was written (the team was retired, a rep of it went away by
        -- command or it has no active member): take the lead back, route_lead decides it
        DELETE FROM leads WHERE id = l.id;
        RETURN NEXT;
        RETURN;
    END IF;
    status := 'assigned';
    lead_id := l.id;
    owner_id := r.owner_id;
    owner_name := r.owner_name;
    cand_ids := r.ids;
    cand_skips := r.skips;
    RETURN NEXT;
END
$$;

-- The check a delete of a lead makes for leads merged into it (see above).
CREATE INDEX leads_merged_into ON leads (merged_into) WHERE merged_into IS NOT NULL;
