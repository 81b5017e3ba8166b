-- Assignment history, reassignment, SLA re-route and recorded routing decisions.
-- `assignments` keeps exactly one row per lead: its CURRENT owner (UNIQUE (lead_id), so the
-- database itself refuses a second current owner). A reassignment copies the replaced row to
-- `assignment_history`, with why it ended, and updates the current row, in one transaction
-- that holds the row's lock.

-- Why the lead has its current owner: routed (rule + rotation), rotated (`reassign --rotate`),
-- reassigned (`reassign --to`), rep_deactivated, sla_expired. `note` is the operator's text.
ALTER TABLE assignments ADD COLUMN reason text NOT NULL DEFAULT 'routed';
ALTER TABLE assignments ADD COLUMN note text;
-- When set, the poll checks the CRM at this time: a lead still in its initial status is
-- re-routed once (reason sla_expired). Cleared when checked.
ALTER TABLE assignments ADD COLUMN sla_due_at timestamptz;
CREATE INDEX assignments_sla_due ON assignments (org, sla_due_at) WHERE sla_due_at IS NOT NULL;

-- Earlier owners, oldest first per lead; `ended_reason` is the reason of the assignment that
-- replaced this one.
CREATE TABLE assignment_history (
    id            bigserial PRIMARY KEY,
    assignment_id bigint NOT NULL REFERENCES assignments (id),
    lead_id       bigint NOT NULL REFERENCES leads (id),
    org           text NOT NULL,
    team_id       bigint NOT NULL REFERENCES teams (id),
    member_id     bigint NOT NULL REFERENCES members (id),
    crm_user_id   text NOT NULL,
    epoch         integer NOT NULL,
    reason        text NOT NULL,
    note          text,
    assigned_at   timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL DEFAULT now(),
    ended_reason  text NOT NULL
);
CREATE INDEX assignment_history_lead ON assignment_history (lead_id, id);

-- Every routing decision, written in the transaction that acts on it (never reconstructed):
-- the rules tried, the team, each candidate rep with its skip reason, the pick and its
-- standing in the rotation; reassignments and SLA checks likewise. `connector explain`
-- reads these. Retention removes the field values (`detail.values`) with the lead's fields.
CREATE TABLE routing_decisions (
    id      bigserial PRIMARY KEY,
    org     text NOT NULL,
    lead_id bigint NOT NULL REFERENCES leads (id),
    kind    text NOT NULL CHECK (kind IN ('route', 'reassign', 'sla')),
    detail  jsonb NOT NULL,
    made_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX routing_decisions_lead ON routing_decisions (lead_id, id);
CREATE INDEX routing_decisions_made ON routing_decisions (made_at);

-- Owners the CRM may show because of our own earlier writes of this lead (the owner we last
-- wrote, and writes that were in flight when a reassignment replaced them). The dispatcher
-- writes over these and over intake owners, never over anyone else.
ALTER TABLE outbox ADD COLUMN replaces_owners text[] NOT NULL DEFAULT '{}';
CREATE INDEX outbox_lead ON outbox (lead_id, id);
