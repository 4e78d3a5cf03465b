#!/bin/bash
set -euo pipefail
cd /app/service
deleted_in=$(git rev-list -n 1 HEAD -- config/settings.ini)
git checkout "${deleted_in}^" -- config/settings.ini
git -c user.name=Oracle -c user.email=oracle@example.com commit -qm "Restore config/settings.ini"
