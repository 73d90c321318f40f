# limits.sh - sourced by scripts/test.sh, scripts/demo.sh and netns-tests/run:
#   limit_of KEY   prints KEY's time limit in seconds from scripts/time-limits; when KEY has no
#                  line there, says which line to add (on stderr) and returns 1.
LACE_TIME_LIMITS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/time-limits

limit_of() {
  local v
  v=$(awk -v k="$1" '$1 == k && $2 ~ /^[0-9]+$/ { print $2; exit }' "$LACE_TIME_LIMITS")
  if [ -z "$v" ]; then
    echo "no time limit for '$1': add a line '$1 SECONDS' to $LACE_TIME_LIMITS (at least twice" \
      "its time measured from a fresh clone on the CI machine; see that file's header)" >&2
    return 1
  fi
  echo "$v"
}
