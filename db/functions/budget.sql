-- One CRM call budget per org, shared by every process (connector/core/budget.py): a token
-- bucket in crm_budgets, refilled at :rate per second up to :burst, taken from in one
-- statement under the row's lock, on the server's clock.

-- Take one call from the org's bucket: 0 when taken, else the seconds until one is there.
CREATE OR REPLACE FUNCTION crm_budget_take(p_org text, p_rate float8, p_burst float8)
RETURNS float8
LANGUAGE plpgsql
AS $$
DECLARE
    now_at timestamptz := clock_timestamp();
    have   float8;
BEGIN
    INSERT INTO crm_budgets (org, tokens, updated_at) VALUES (p_org, p_burst, now_at)
    ON CONFLICT (org) DO NOTHING;
    SELECT least(p_burst, b.tokens + p_rate * extract(epoch FROM now_at - b.updated_at))
    INTO have
    FROM crm_budgets b WHERE b.org = p_org FOR UPDATE;
    IF have >= 1 THEN
        UPDATE crm_budgets SET tokens = have - 1, updated_at = now_at WHERE org = p_org;
        RETURN 0;
    END IF;
    UPDATE crm_budgets SET tokens = have, updated_at = now_at WHERE org = p_org;
    RETURN (1 - have) / p_rate;
END
$$;
