#!/bin/bash
set -euo pipefail
cat > /app/report.sh <<'SH'
#!/bin/bash
# Top 3 client IPs by count of 5xx responses: "COUNT IP".
awk '$(NF-1) ~ /^5[0-9][0-9]$/ { print $1 }' "$1" | sort | uniq -c \
  | awk '{ print $1, $2 }' | LC_ALL=C sort -k1,1nr -k2,2 | head -n 3
SH
chmod +x /app/report.sh
