-- Notifications queued in the transaction that records an assignment (called by
-- record_assignments in routing.sql and by move_assignment in db/reassign.sql, one statement
-- each). One row per rep and channel; sent later by connector/notify/dispatch.py.

-- queue_notifications: p_lead_ids and p_member_ids pair each lead with the member told about
-- it (a NULL member: nobody); p_kinds holds one kind for all or one per lead; p_event starts
-- each row's dedupe key (the assignment event: 'assigned', or 'moved:' and the history id).
-- With no notify_settings row for the org (notifications off) it returns after that one
-- primary-key probe (route_team reads the same before its lock and, with notifications off,
-- has record_assignments skip the call). Reps in opted_out get no row.
-- Returns the number of rows queued.
CREATE OR REPLACE FUNCTION queue_notifications(
    p_org text, p_lead_ids bigint[], p_member_ids bigint[], p_kinds text[], p_event text,
    p_detail jsonb
)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_channels  text[];
    v_opted_out text[];
    v_n         integer;
BEGIN
    SELECT s.channels, s.opted_out INTO v_channels, v_opted_out
    FROM notify_settings s WHERE s.org = p_org;
    IF NOT FOUND OR cardinality(v_channels) = 0 THEN
        RETURN 0;
    END IF;
    INSERT INTO notifications (org, kind, channel, recipient, lead_id, detail, dedupe_key)
    SELECT p_org, k.kind, c.channel, m.crm_user_id, q.lead_id, coalesce(p_detail, '{}'),
           concat_ws(':', p_event, q.lead_id, k.kind, c.channel)
    FROM unnest(p_lead_ids, p_member_ids) WITH ORDINALITY AS q (lead_id, member_id, ord)
    JOIN members m ON m.id = q.member_id
    CROSS JOIN LATERAL (SELECT coalesce(p_kinds[q.ord], p_kinds[1]) AS kind) k
    CROSS JOIN unnest(v_channels) AS c (channel)
    WHERE NOT (m.crm_user_id = ANY (v_opted_out))
    ORDER BY q.ord, c.channel
    ON CONFLICT (dedupe_key) DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
