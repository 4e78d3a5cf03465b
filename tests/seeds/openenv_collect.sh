harbor collect openspiel:tic_tac_toe \
    --base-url "$HARBOR_URL" \
    --output-dir /tmp/ttt-scripted \
    -n 10 --provider scripted
