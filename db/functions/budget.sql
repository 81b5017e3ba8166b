-- One CRM call budget per org, shared by every process (connector/core/budget.py): the send
-- times of the calls of the last window in crm_budgets, taken from in one statement under
-- the row's lock, on the server's clock (the rolling window the CRM counts, as each
-- process's own limiter in crm_adapters/ratelimit.py counts it).

-- Take one call of at most p_limit in any p_window seconds: 0 when taken, else the seconds
-- until the oldest call of the window leaves it.
CREATE OR REPLACE FUNCTION crm_budget_take(p_org text, p_limit integer, p_window float8)
RETURNS float8
LANGUAGE plpgsql
AS $$
DECLARE
    now_at timestamptz := clock_timestamp();
    kept   timestamptz[];
BEGIN
    INSERT INTO crm_budgets (org) VALUES (p_org) ON CONFLICT (org) DO NOTHING;
    SELECT coalesce(array_agg(t ORDER BY t), '{}')
    INTO kept
    FROM (SELECT calls FROM crm_budgets WHERE org = p_org FOR UPDATE) b, unnest(b.calls) AS t
    WHERE t > now_at - make_interval(secs => p_window);
    IF cardinality(kept) < p_limit THEN
        UPDATE crm_budgets SET calls = kept || now_at, updated_at = now_at WHERE org = p_org;
        RETURN 0;
    END IF;
    UPDATE crm_budgets SET calls = kept, updated_at = now_at WHERE org = p_org;
    RETURN greatest(
        extract(epoch FROM kept[cardinality(kept) - p_limit + 1]
                          + make_interval(secs => p_window) - now_at)::float8,
        0.001);
END
$$;
