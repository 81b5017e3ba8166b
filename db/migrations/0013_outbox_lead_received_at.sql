-- 0013_outbox_lead_received_at.sql
-- The lead's received_at, copied onto each outbox row when it is written (the statements that
-- write outbox rows read the lead anyway), so the dashboard's lead->CRM latency reads only
-- the outbox rows of its window instead of looking up every one's lead by primary key (31,000
-- lookups a day at 1,000,000 leads). Rows written before this migration have NULL here; the
-- dashboard looks their lead up as before.
ALTER TABLE outbox ADD COLUMN lead_received_at timestamptz;
