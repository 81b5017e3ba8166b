-- Caps, working hours, time off and catch-up (the team lock still serialises every pick).

-- Turns credited to a rep that the rotation passed over (capped, off shift, or away under
-- `catch_up: none`): its turns are assigned_in_epoch + credited_in_epoch. Reset with the epoch.
ALTER TABLE members ADD COLUMN credited_in_epoch bigint NOT NULL DEFAULT 0;

-- Leads per member per day and per week (local dates in the team's time zone; a week starts
-- on its Monday), counted in the statement that records the assignments, under the team lock.
CREATE TABLE member_load (
    member_id bigint NOT NULL REFERENCES members (id),
    period    text NOT NULL CHECK (period IN ('day', 'week')),
    starts_on date NOT NULL,
    assigned  integer NOT NULL,
    PRIMARY KEY (member_id, period, starts_on)
);

-- Time off set from the command line (`connector rep away`), one row per rep of an org; the
-- rep gets no lead from starts_at until `until`. Read by every process at its next pick.
CREATE TABLE rep_time_off (
    org         text NOT NULL,
    crm_user_id text NOT NULL,
    starts_at   timestamptz NOT NULL,
    until       timestamptz NOT NULL,
    reason      text,
    set_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org, crm_user_id),
    CHECK (until > starts_at)
);

-- The team's latest owners, for `catch_up: {max_in_a_row: K}`.
CREATE INDEX assignments_team_recent ON assignments (team_id, id);
