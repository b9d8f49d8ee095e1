#!/bin/bash
sed -i 's/wrold/world/' /app/greeting.txt
