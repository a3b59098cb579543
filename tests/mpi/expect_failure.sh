#!/usr/bin/env bash
# expect_failure.sh PATTERN COMMAND...: passes when COMMAND exits non-zero within the test's timeout
# and its output contains PATTERN (the clear error a user must see).
pattern=$1
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [[ $status -eq 0 ]]; then
  echo "expect_failure: command succeeded but should have failed" >&2
  exit 1
fi
if ! grep -qF -- "$pattern" <<<"$output"; then
  echo "expect_failure: exit $status, but the output does not contain '$pattern'" >&2
  exit 1
fi
echo "expect_failure: failed as expected (exit $status)"
