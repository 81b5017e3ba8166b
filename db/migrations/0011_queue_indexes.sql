-- 0011_queue_indexes.sql
-- Queue lookups that stay cheap when VACUUM cannot keep up (a long transaction holds its
-- snapshot): the claim's "is this parent in another claim in flight?" test looks rows up by
-- parent, so it reads only that parent's row versions instead of every version that was ever
-- 'claimed' (all of them are, once) through outbox_org_state.
CREATE INDEX outbox_claimed_parent ON outbox (org, parent_id) WHERE state = 'claimed';
