-- 0012_status_counts.sql
-- `connector status` (and the dashboard's totals page) counts every lead and assignment of an
-- org. These indexes let each count be an index-only scan of a small index instead of a join
-- of leads and assignments (37 s at 1,000,000 leads): see db/status.sql and BENCHMARKS.md.

-- Live leads of an org (merged_into IS NULL: one deduplicated key, a few MB per million
-- leads), and the few merged ones, whose assignments the counts leave out.
CREATE INDEX leads_org_merged ON leads (org, merged_into);
-- Leads each member got through their account's owner (the rest of a member's leads are
-- counted from assignments_member).
CREATE INDEX assignments_account_matched ON assignments (member_id)
    WHERE account_match->>'result' = 'matched';
