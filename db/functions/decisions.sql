-- How recorded routing decisions are read (db/functions/: applied on every migrate, see
-- connector/shell/migrations.py apply_functions).

-- routing_decisions as readers see them, one detail whoever wrote the row: a pick recorded in
-- columns (seat_ids and the rest) is folded into detail.
CREATE OR REPLACE VIEW decision_details AS
SELECT d.id, d.org, d.lead_id, d.kind, d.made_at,
       CASE WHEN d.seat_ids IS NULL THEN d.detail
            ELSE d.detail || jsonb_build_object(
                     'batch', d.batch, 'epoch', d.epoch, 'chosen_id', d.chosen_id,
                     'seats', jsonb_build_object('ids', d.seat_ids, 'weights', d.seat_weights,
                                                 'counts', d.seat_counts,
                                                 'skips', d.seat_skips))
       END AS detail
FROM routing_decisions d;
