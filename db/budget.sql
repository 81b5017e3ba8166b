-- Named SQL for the shared CRM call budget (connector/core/budget.py).

-- name: take
SELECT crm_budget_take(:org, :limit, :window_s) AS wait_s
