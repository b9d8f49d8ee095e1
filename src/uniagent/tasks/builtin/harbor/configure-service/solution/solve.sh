#!/bin/bash
cat > /srv/app/service.ini <<'INI'
[server]
enabled = true
port = 8765
body_file = motd.txt
INI
