#!/bin/bash
# Build the task's repository: settings.ini is changed twice, then deleted, then other work follows.
set -euo pipefail
git init -q -b main /app/service
cd /app/service
git config user.name "Dev"
git config user.email "dev@example.com"
mkdir -p config src
printf '[server]\nport = 8000\n' > config/settings.ini
printf 'print("v1")\n' > src/app.py
git add -A && git commit -qm "Initial service"
printf '[server]\nport = 8080\nworkers = 4\n' > config/settings.ini
git commit -qam "Tune server"
printf '[server]\nport = 8080\nworkers = 4\n\n[db]\nurl = sqlite:///data.db\n' > config/settings.ini
git commit -qam "Add database settings"
git rm -q config/settings.ini
git commit -qm "Clean up config"
printf 'print("v2")\n' > src/app.py
git commit -qam "App v2"
