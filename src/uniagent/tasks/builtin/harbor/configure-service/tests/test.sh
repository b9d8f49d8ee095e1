#!/bin/bash
# Starts the service as configured, asks it for its message; reward.json keeps each check.
cd /srv/app
python3 server.py > /logs/verifier/server.log 2>&1 &
pid=$!
got=""
for _ in $(seq 50); do
  got=$(python3 /tests/fetch.py "$SERVICE_PORT" 2>/dev/null) && break
  kill -0 $pid 2>/dev/null || break  # the service exited: it will not answer
  sleep 0.1
done
kill $pid 2>/dev/null
starts=0; answers=0
[ -n "$got" ] && starts=1
[ "$got" = "$(cat /srv/app/motd.txt)" ] && answers=1
reward=$(( starts * answers ))
printf '{"reward": %d, "starts": %d, "answers": %d}\n' $reward $starts $answers > /logs/verifier/reward.json
