# Shared by every results/*/run.sh (and seeds_lib.sh): where an experiment script writes, and what it
# records about the code that wrote it. Source it, do not run it.
#
#   out_init NAME [OUT [ARGS ...]]
#       sets OUT: the given folder, else $OUT, else a fresh `mktemp -d` folder outside the repository
#       (lctx-NAME.XXXXXX under $TMPDIR or /tmp), and prints it; refuses (exit 2) an OUT inside the
#       repository's work tree that git does not ignore, unless FORCE=1; appends the git revision and dirty
#       state (`git rev-parse HEAD`, `git status --porcelain`) to OUT/provenance.txt (one block per start, so a
#       resumed run lists every revision that wrote into it). Refuses (exit 2) a work tree with uncommitted
#       changes unless ALLOW_DIRTY=1 (a number must trace to a revision that holds the code that made it), and
#       an `lctx` on PATH that imports another checkout's code (the development checkout's editable install,
#       say: then the revision recorded is not the code that ran), also unless ALLOW_DIRTY=1. Sets PUB, the
#       folder the script copies its tables and plots into: OUT/results (the names of the committed folder, so
#       `diff -r` compares them), or the script's own folder $HERE (overwriting the committed copies) when
#       FORCE=1.
#   out_guard PATH   out_init's refusal, for any folder
#
# FORCE=1 is the one way to write into the repository: it is what updating a committed result means.
_out_repo() {  # the work tree holding this file, empty when it is not a git checkout
  git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel 2>/dev/null || true
}

out_guard() {  # out_guard PATH: exit 2 when PATH lies in the repository and git does not ignore it
  local top p rel
  top="$(_out_repo)"
  [ -n "$top" ] && [ "${FORCE:-0}" != 1 ] || return 0
  top="$(realpath -m "$top")"; p="$(realpath -m "$1")"
  case "$p/" in "$top"/*) ;; *) return 0 ;; esac
  rel="${p#"$top"}"; rel="${rel#/}"
  if [ -z "$rel" ] || [ -n "$(git -C "$top" ls-files -- "$rel" | head -1)" ] \
    || ! git -C "$top" check-ignore -q -- "$rel"; then
    echo "error: $1 is inside the repository ($top) and not git-ignored: the run would write beside" \
      "committed files; give a folder outside it (the default is a fresh temporary folder), or FORCE=1" \
      "to write there on purpose" >&2
    exit 2
  fi
}

provenance() {  # provenance DIR: append the git revision, dirty state and command line to DIR/provenance.txt
  local top rev status
  top="$(_out_repo)"
  {
    echo "# $(date -u +%FT%TZ): $0 ${*:2}"
    if [ -n "$top" ]; then
      rev="$(git -C "$top" rev-parse HEAD)"
      status="$(git -C "$top" status --porcelain)"
      echo "revision: $rev"
      if [ -n "$status" ]; then echo "dirty: yes"; printf '%s\n' "$status" | sed 's/^/  /'
      else echo "dirty: no"; fi
    else
      echo "revision: unknown (not a git checkout)"
    fi
    echo "FORCE: ${FORCE:-0}"
    echo "ALLOW_DIRTY: ${ALLOW_DIRTY:-0}"
    local v  # the scripts' size knobs, when set: a 20-step smoke run must not read like the full experiment
    for v in STEPS SEEDS SETS VARIANTS NAMES JOBS; do [ -z "${!v:-}" ] || echo "$v: ${!v}"; done
  } >> "$1/provenance.txt"
}

out_dirty_guard() {  # exit 2 when the work tree has uncommitted changes, unless ALLOW_DIRTY=1
  local top status
  top="$(_out_repo)"
  [ -n "$top" ] && [ "${ALLOW_DIRTY:-0}" != 1 ] || return 0
  status="$(git -C "$top" status --porcelain)"
  [ -z "$status" ] && return 0
  echo "error: the work tree has uncommitted changes ($(printf '%s\n' "$status" | head -3 | cut -c4- | tr '\n' ' ' \
    | sed 's/ $//')): commit them first, so that provenance.txt's revision names the code that ran, or" \
    "ALLOW_DIRTY=1 to run anyway (recorded as dirty)" >&2
  exit 2
}

out_code_guard() {  # exit 2 when the `lctx` on PATH runs another checkout's code, unless ALLOW_DIRTY=1
  local top exe py src
  top="$(_out_repo)"
  [ -n "$top" ] && [ -f "$top/pyproject.toml" ] && [ -f "$top/cli.py" ] && [ "${ALLOW_DIRTY:-0}" != 1 ] || return 0
  exe="$(command -v lctx || true)"
  [ -n "$exe" ] || { echo "error: no lctx on PATH: install this checkout (pip install -e $top) in the" \
    "environment the script runs in" >&2; exit 2; }
  py="$(sed -n '1s/^#!//p' "$exe")"  # a pip entry point: #!/path/to/python (or a sh trampoline naming it)
  case "$py" in *python*) ;; *) py="$(grep -o "exec' \"[^\"]*\"" "$exe" | head -1 | cut -d'"' -f2)" ;; esac
  src="$("${py:-python}" -c 'import os, lctx; print(os.path.dirname(os.path.realpath(lctx.__file__)))' 2>/dev/null \
    || true)"
  if [ "$(realpath -m "${src:-?}")" != "$(realpath -m "$top")" ]; then
    echo "error: the lctx on PATH ($exe) runs the code in ${src:-an unknown place}, not this checkout ($top):" \
      "provenance.txt's revision would not name the code that ran; run from an environment with this checkout" \
      "installed (python3 -m venv .venv && .venv/bin/pip install -e .), or ALLOW_DIRTY=1 to run anyway" >&2
    exit 2
  fi
}

out_init() {  # out_init NAME [OUT] [script args for the record ...]: sets and prepares OUT (see above)
  local name="$1"; shift
  out_dirty_guard
  out_code_guard
  OUT="${1:-${OUT:-}}"
  if [ -z "$OUT" ]; then OUT="$(mktemp -d "${TMPDIR:-/tmp}/lctx-$name.XXXXXX")"; fi
  out_guard "$OUT"
  mkdir -p "$OUT"
  OUT="$(cd "$OUT" && pwd)"
  echo "OUT=$OUT (give it again as the first argument to resume)" >&2
  provenance "$OUT" "$@"
  PUB="$OUT/results"
  if [ "${FORCE:-0}" = 1 ]; then PUB="${HERE:?out_init: set HERE to the script folder first}"; fi
}
