# Sourced by the tests/pslite scripts.
# expect LOG PATTERN COUNT: LOG holds COUNT lines matching PATTERN; else
# prints LOG and exits 1.
expect() {
  local got
  got=$(grep -c -- "$2" "$1" || true)
  if [ "$got" -ne "$3" ]; then
    echo "FAIL: expected $3 lines matching '$2' in $1, got $got:" >&2
    cat "$1" >&2
    exit 1
  fi
}
