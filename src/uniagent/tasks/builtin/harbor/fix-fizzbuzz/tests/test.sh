#!/bin/bash
# The program is graded by its pytest suite: reward 1 when every test passes.
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_fizzbuzz.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
