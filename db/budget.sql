-- Named SQL for the shared CRM call budget (connector/core/budget.py).

-- name: take
SELECT crm_budget_take(:org, :rate, :burst) AS wait_s
