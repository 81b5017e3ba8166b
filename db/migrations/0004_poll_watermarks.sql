-- Where each org's scheduled poll has read up to (the CRM's last-modified time).
CREATE TABLE poll_watermarks (
    org        text PRIMARY KEY,
    watermark  timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
