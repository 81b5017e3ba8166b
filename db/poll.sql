-- Named SQL for the scheduled poll.

-- name: try_lock
SELECT pg_try_advisory_lock(hashtext('lead-routing-connector:poll'), hashtext(:org))

-- name: unlock
SELECT pg_advisory_unlock(hashtext('lead-routing-connector:poll'), hashtext(:org))

-- name: watermark
SELECT watermark FROM poll_watermarks WHERE org = :org

-- name: advance
INSERT INTO poll_watermarks (org, watermark) VALUES (:org, :watermark)
ON CONFLICT (org) DO UPDATE
SET watermark = GREATEST(poll_watermarks.watermark, EXCLUDED.watermark), updated_at = now()
