-- Routing state: teams, members, leads, assignments and the write-back outbox.

CREATE TABLE teams (
    id          bigserial PRIMARY KEY,
    org         text NOT NULL,
    name        text NOT NULL,
    -- Bumped by every routing-relevant membership edit; counts restart with each epoch.
    epoch       integer NOT NULL DEFAULT 1,
    fingerprint text NOT NULL DEFAULT '',
    in_config   boolean NOT NULL DEFAULT true,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org, name)
);

CREATE TABLE members (
    id                bigserial PRIMARY KEY,
    team_id           bigint NOT NULL REFERENCES teams (id),
    crm_user_id       text NOT NULL,
    name              text NOT NULL,
    weight            integer NOT NULL CHECK (weight > 0),
    active            boolean NOT NULL DEFAULT true,
    in_config         boolean NOT NULL DEFAULT true,
    position          integer NOT NULL,
    -- Leads this member got in the team's current epoch (the rotation's only state).
    assigned_in_epoch bigint NOT NULL DEFAULT 0,
    UNIQUE (team_id, crm_user_id)
);

CREATE TABLE leads (
    id                bigserial PRIMARY KEY,
    org               text NOT NULL,
    crm_object        text NOT NULL,
    crm_id            text NOT NULL,
    fields            jsonb NOT NULL,
    parent_id         text,
    source            text NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    unassigned_reason text,
    UNIQUE (org, crm_object, crm_id)
);

-- The audit of who got which lead. UNIQUE (lead_id): no lead can ever have two owners.
CREATE TABLE assignments (
    id          bigserial PRIMARY KEY,
    lead_id     bigint NOT NULL UNIQUE REFERENCES leads (id),
    org         text NOT NULL,
    team_id     bigint NOT NULL REFERENCES teams (id),
    member_id   bigint NOT NULL REFERENCES members (id),
    crm_user_id text NOT NULL,
    epoch       integer NOT NULL,
    rule_index  integer NOT NULL,
    rule_name   text NOT NULL,
    source      text NOT NULL,
    assigned_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX assignments_member ON assignments (member_id);
CREATE INDEX assignments_org ON assignments (org, team_id);

-- One row per owner write the CRM still has to see; written in the assignment's transaction.
CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    org           text NOT NULL,
    lead_id       bigint NOT NULL REFERENCES leads (id),
    assignment_id bigint NOT NULL REFERENCES assignments (id),
    crm_object    text NOT NULL,
    crm_id        text NOT NULL,
    owner_id      text NOT NULL,
    parent_id     text,
    state         text NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'claimed', 'sent', 'dead', 'superseded')),
    attempts      integer NOT NULL DEFAULT 0,
    available_at  timestamptz NOT NULL DEFAULT now(),
    claimed_by    text,
    lease_until   timestamptz,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
CREATE INDEX outbox_pending ON outbox (org, available_at, id) WHERE state = 'pending';
CREATE INDEX outbox_claimed ON outbox (lease_until) WHERE state = 'claimed';
CREATE INDEX outbox_org_state ON outbox (org, state);
