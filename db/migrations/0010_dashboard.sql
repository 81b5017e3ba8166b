-- The operator's dashboard reads windows of recent activity; these indexes keep its queries
-- off full scans however many leads are stored. Nothing new is recorded: the lead->CRM
-- latency is leads.received_at to outbox.finished_at of the 'sent' row.

-- Leads per rep in a time window, and the latest decisions: an index-only range scan.
CREATE INDEX assignments_org_time ON assignments (org, assigned_at, id)
    INCLUDE (team_id, member_id);
-- Dead and superseded rows, newest first (replaces the (org, state) index, of which it is
-- a prefix-compatible superset).
DROP INDEX outbox_org_state;
CREATE INDEX outbox_org_state_id ON outbox (org, state, id);
-- The oldest row the CRM has not seen yet.
CREATE INDEX outbox_open_age ON outbox (org, created_at) WHERE state IN ('pending', 'claimed');
-- A lead's explanation page: the pushes that named its record (its outbox rows use
-- outbox_lead, made by 0009).
CREATE INDEX intake_events_record ON intake_events (org, crm_id);
