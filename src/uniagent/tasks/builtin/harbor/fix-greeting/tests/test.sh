#!/bin/bash
# Harbor's convention: the reward goes to /logs/verifier/reward.txt.
if [ "$(cat /app/greeting.txt)" = "Hello, world!" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
