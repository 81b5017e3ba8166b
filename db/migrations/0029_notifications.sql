-- Notifications to reps and admins (Slack, email), delivered like owner writes: rows written
-- in the transaction that records the assignment (db/functions/notifications.sql
-- queue_notifications), sent by dispatchers that claim with SKIP LOCKED under a lease
-- (db/notify.sql, connector/notify/dispatch.py).

-- The orgs that notify reps, written from the YAML when the config is applied
-- (connector/notify/settings.py). No row: queue_notifications returns after one probe of this
-- primary key, so routing with notifications off writes nothing more.
CREATE TABLE notify_settings (
    org        text PRIMARY KEY,
    -- the channels a rep is told on: 'slack', 'email'
    channels   text[] NOT NULL,
    -- crm_user_ids of reps who opted out: no row is written for them
    opted_out  text[] NOT NULL DEFAULT '{}',
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE notifications (
    id           bigserial PRIMARY KEY,
    org          text NOT NULL,
    -- assigned | reassigned_to | reassigned_from (recipient: a rep's crm_user_id) or alert
    -- (recipient 'admins'; detail says which alert, how many, since when)
    kind         text NOT NULL
                 CHECK (kind IN ('assigned', 'reassigned_to', 'reassigned_from', 'alert')),
    channel      text NOT NULL CHECK (channel IN ('slack', 'email')),
    recipient    text NOT NULL,
    lead_id      bigint,
    detail       jsonb NOT NULL DEFAULT '{}',
    -- One per message: a row is queued once (ON CONFLICT DO NOTHING), and the message sent
    -- carries it (Slack metadata, the email's Message-ID) so that a repeat after a crash
    -- between sending and recording can be recognised.
    dedupe_key   text NOT NULL UNIQUE,
    state        text NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'claimed', 'sent', 'dead')),
    attempts     integer NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL DEFAULT now(),
    claimed_by   text,
    lease_until  timestamptz,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    -- Set when the row was held because its rep was off shift or away (quiet hours): held
    -- rows go out together, in one digest, when the rep is back.
    held_since   timestamptz,
    -- The dedupe key of the message that carried this row (its own, or a digest's).
    sent_as      text
);
ALTER TABLE notifications SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX notifications_pending ON notifications (org, id) WHERE state = 'pending';
CREATE INDEX notifications_leased ON notifications (org, lease_until) WHERE lease_until IS NOT NULL;
CREATE INDEX notifications_finished ON notifications (org, state, id) WHERE state IN ('dead', 'sent');
