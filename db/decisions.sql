-- Named SQL for recorded routing decisions (the table routing_decisions; whole decisions are
-- read through the view decision_details, db/functions/decisions.sql).

-- name: record_decisions
-- One row per lead, in the transaction that made the decision; a lead whose rule or team has
-- an SLA gets its check time on the assignment written earlier in the same transaction.
-- :details is ONE JSON array (a text[] of long JSON strings costs the driver far more to
-- send: every element is escaped), zipped with the ids by position.
WITH d AS (
    SELECT *
    FROM ROWS FROM (unnest(CAST(:lead_ids AS bigint[])),
                    jsonb_array_elements(CAST(:details AS jsonb)),
                    unnest(CAST(:sla_minutes AS integer[])))
         AS d (lead_id, detail, sla_minutes)
), sla AS (
    UPDATE assignments a
    SET sla_due_at = a.assigned_at + make_interval(mins => d.sla_minutes)
    FROM d
    WHERE a.lead_id = d.lead_id AND d.sla_minutes IS NOT NULL
    RETURNING a.id
)
INSERT INTO routing_decisions (org, lead_id, kind, detail)
SELECT :org, d.lead_id, :kind, d.detail FROM d ORDER BY d.lead_id
