-- Lead-to-account matching (rules with `route_to: account_owner`): a mirror of the CRM's
-- Accounts (Salesforce) or Companies (HubSpot) with their owners and normalised domains,
-- refreshed by the poll from its own watermark (the CRM's last-modified time). Ids and owners
-- are stored in the form they are compared in (Salesforce: 18 characters).
CREATE TABLE crm_accounts (
    org         text NOT NULL,
    crm_id      text NOT NULL,
    owner_id    text,
    modified_at timestamptz NOT NULL,
    synced_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org, crm_id)
);

-- Every matchable registrable domain of an account (from its website and domain fields).
CREATE TABLE crm_account_domains (
    org    text NOT NULL,
    domain text NOT NULL,
    crm_id text NOT NULL,
    PRIMARY KEY (org, domain, crm_id),
    FOREIGN KEY (org, crm_id) REFERENCES crm_accounts (org, crm_id) ON DELETE CASCADE
);
CREATE INDEX crm_account_domains_account ON crm_account_domains (org, crm_id);

-- Where each org's account refresh has read up to.
CREATE TABLE account_watermarks (
    org        text PRIMARY KEY,
    watermark  timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- How a lead under an account_owner rule was decided, written with its assignment: the
-- account it matched (result "matched"; the rotation did not advance), or why it fell back to
-- the team rotation. NULL for leads routed by an ordinary rule.
ALTER TABLE assignments ADD COLUMN account_match jsonb;
