-- Salesforce user ids (reps, intake owners) in their canonical 18-character form in every
-- table that holds them: the form the configuration gives them when it is loaded
-- (connector/core/config_loading.py _canonical_ids), so that a YAML's reps are the members
-- already stored, with their counts.
--
-- A value changes when it has the shape of a Salesforce id of a standard object (00 and 13
-- or 16 letters and digits: users are 005..., queues 00G...) and salesforce_id_18 gives it
-- another form; HubSpot ids are numbers without leading zeros and never have that shape.
-- owner_found, found_owner and crm_accounts.owner_id were read from the CRM's API, which
-- sends the 18 characters. salesforce_id_18 comes from db/functions/ids.sql, applied after
-- the migrations: a database created by this release has no rows to change and no such
-- function yet.
DO $$
DECLARE
    shape constant text := '^00[A-Za-z0-9]{13}([A-Za-z0-9]{3})?$';
BEGIN
    IF to_regprocedure('salesforce_id_18(text)') IS NULL THEN
        RETURN;
    END IF;

    -- The members' new ids. A rep listed in one team under two forms of its id (its YAML
    -- changed form once) has two rows, one retired: the row in the config takes the 18
    -- characters and the retired row the form the other had. Other rows that share one id
    -- (both retired, both in the config) are left as they are.
    CREATE TEMP TABLE member_ids ON COMMIT DROP AS
    WITH g AS (
        SELECT m.id, m.team_id, m.in_config, m.crm_user_id AS old,
               salesforce_id_18(m.crm_user_id) AS canon
        FROM members m WHERE m.crm_user_id ~ shape
    ), c AS (
        SELECT g.*, count(*) OVER w AS n, count(*) FILTER (WHERE g.in_config) OVER w AS n_in,
               max(g.old) FILTER (WHERE g.in_config) OVER w AS configured
        FROM g WINDOW w AS (PARTITION BY g.team_id, g.canon)
    )
    SELECT id, old, CASE WHEN n = 1 OR in_config THEN canon ELSE configured END AS new
    FROM c
    WHERE (n = 1 AND old <> canon)
       OR (n = 2 AND n_in = 1 AND configured <> canon AND (in_config OR old = canon));

    -- A team's fingerprint (connector/routing/teams.py rotation_fingerprint: the first 32
    -- hex digits of the SHA-256 of json.dumps([[crm_user_id, weight, active], ...]) over its
    -- configured members in order) is recomputed over the new ids, so that the config, now
    -- loaded with them, is the same rotation and the team keeps its epoch and counts. Only a
    -- fingerprint this formula reproduces from the stored members is replaced; any other
    -- (the members are not those it was computed over) is left, and the next apply of the
    -- config starts a new epoch as it would have.
    UPDATE teams t SET fingerprint = f.new_fp
    FROM (
        SELECT m.team_id,
               left(encode(sha256(convert_to('[' || string_agg(
                   '[' || to_json(m.crm_user_id)::text || ', ' || m.weight || ', '
                       || m.active::text || ']',
                   ', ' ORDER BY m.position) || ']', 'UTF8')), 'hex'), 32) AS old_fp,
               left(encode(sha256(convert_to('[' || string_agg(
                   '[' || to_json(coalesce(v.new, m.crm_user_id))::text || ', ' || m.weight
                       || ', ' || m.active::text || ']',
                   ', ' ORDER BY m.position) || ']', 'UTF8')), 'hex'), 32) AS new_fp
        FROM members m LEFT JOIN member_ids v ON v.id = m.id
        WHERE m.in_config
        GROUP BY m.team_id
    ) f
    WHERE t.id = f.team_id AND t.fingerprint = f.old_fp AND f.new_fp <> f.old_fp;

    -- Through values no row holds, so that two rows trading ids never meet on
    -- UNIQUE (team_id, crm_user_id).
    UPDATE members m SET crm_user_id = v.old || '#' || m.id FROM member_ids v WHERE v.id = m.id;
    UPDATE members m SET crm_user_id = v.new FROM member_ids v WHERE v.id = m.id;

    UPDATE assignments SET crm_user_id = salesforce_id_18(crm_user_id)
    WHERE crm_user_id ~ shape AND salesforce_id_18(crm_user_id) <> crm_user_id;
    UPDATE assignment_history SET crm_user_id = salesforce_id_18(crm_user_id)
    WHERE crm_user_id ~ shape AND salesforce_id_18(crm_user_id) <> crm_user_id;

    UPDATE outbox SET owner_id = salesforce_id_18(owner_id)
    WHERE owner_id ~ shape AND salesforce_id_18(owner_id) <> owner_id;
    UPDATE outbox SET replaces_owners = ARRAY(
        SELECT CASE WHEN u.o ~ shape THEN salesforce_id_18(u.o) ELSE u.o END
        FROM unnest(replaces_owners) WITH ORDINALITY AS u (o, i) ORDER BY u.i)
    WHERE EXISTS (SELECT FROM unnest(replaces_owners) AS u (o)
                  WHERE u.o ~ shape AND salesforce_id_18(u.o) <> u.o);

    -- Time off set under both forms of one rep's id: the latest one stays.
    DELETE FROM rep_time_off o
    WHERE o.crm_user_id ~ shape
      AND EXISTS (
          SELECT FROM rep_time_off k
          WHERE k.org = o.org AND k.crm_user_id <> o.crm_user_id AND k.crm_user_id ~ shape
            AND salesforce_id_18(k.crm_user_id) = salesforce_id_18(o.crm_user_id)
            AND (k.set_at, k.crm_user_id) > (o.set_at, o.crm_user_id));
    UPDATE rep_time_off SET crm_user_id = salesforce_id_18(crm_user_id)
    WHERE crm_user_id ~ shape AND salesforce_id_18(crm_user_id) <> crm_user_id;

    UPDATE notify_settings SET opted_out = ARRAY(
        SELECT CASE WHEN u.o ~ shape THEN salesforce_id_18(u.o) ELSE u.o END
        FROM unnest(opted_out) WITH ORDINALITY AS u (o, i) ORDER BY u.i)
    WHERE EXISTS (SELECT FROM unnest(opted_out) AS u (o)
                  WHERE u.o ~ shape AND salesforce_id_18(u.o) <> u.o);
    UPDATE notifications SET recipient = salesforce_id_18(recipient)
    WHERE recipient ~ shape AND salesforce_id_18(recipient) <> recipient;

    -- Recorded decisions name reps in their detail (candidates, chosen, from,
    -- away_by_command, replaces_owners, an SLA check's owner): every JSON string of the
    -- shape is rewritten (an id in either form names the same record).
    UPDATE routing_decisions d SET detail = x.detail
    FROM (
        SELECT r.id, string_agg(p.part || coalesce('"' || salesforce_id_18(m.arr[1]) || '"', ''),
                                '' ORDER BY p.n)::jsonb AS detail
        FROM routing_decisions r
        CROSS JOIN LATERAL regexp_split_to_table(
            r.detail::text, '"00[A-Za-z0-9]{13}(?:[A-Za-z0-9]{3})?"') WITH ORDINALITY AS p (part, n)
        LEFT JOIN LATERAL regexp_matches(
            r.detail::text, '"(00[A-Za-z0-9]{13}(?:[A-Za-z0-9]{3})?)"', 'g')
            WITH ORDINALITY AS m (arr, n) ON m.n = p.n
        WHERE r.detail::text ~ '"00[A-Za-z0-9]{13}(?:[A-Za-z0-9]{3})?"'
        GROUP BY r.id
    ) x
    WHERE d.id = x.id AND d.detail <> x.detail;
END
$$;
