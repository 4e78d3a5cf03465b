#!/bin/bash
set -euo pipefail
cat > /app/query.sql <<'SQL'
SELECT c.country AS country,
       COUNT(DISTINCT o.id) AS orders,
       ROUND(SUM(i.quantity * i.unit_price), 2) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.id
JOIN order_items i ON i.order_id = o.id
GROUP BY c.country
ORDER BY revenue DESC, country ASC;
SQL
