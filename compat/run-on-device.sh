#!/usr/bin/env bash
# A device bundle's rounds (written by `nox -s bundle`; docs/device.md): both stacks' artifacts timed in
# alternating rounds (A B, B A, …) on one machine, into one results file for `upgrade-gate device-results`.
#
#   ./run-on-device.sh [--host] [--install DIR | --python STACK=PATH …] [--rounds N] [--name NAME] [--out FILE]
#   ./run-on-device.sh --install DIR --stacks-only     build the stacks; a line each: STACK, its Python, why not
#
# With adb and a device attached (and no --host), the files go to the phone and ExecuTorch's executor_runner
# (EXECUTOR_RUNNER=path, built with bundled IO) and PyTorch Mobile's speed_benchmark_torch (SPEED_BENCHMARK_TORCH=path,
# a Lite Interpreter build) run there; the tests do not exercise this path. Otherwise the rounds run on this
# machine (an ARM board, a CI runner) with each stack's Python runtime: the venvs the bundle was made with
# (pythons.tsv), --python STACK=PATH, or --install DIR, which builds each stack there with uv from its spec
# (stacks/<stack>.txt): a stack with no wheels for this platform gives no rounds, and every one of its rounds says
# why (its gate is incomplete, never failed).
#
# Exit 0: the results file is whole. 2: the bundle or the command is wrong (a file changed since it was written,
# an unknown option, no Python for a stack). 3: stopped before every round ran (the partial file is kept).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
say() { printf 'run-on-device.sh: %s\n' "$*" >&2; }
usage_error() { say "$*"; exit 2; }

host_only=0
stacks_only=0  # --stacks-only: the measure session times the rounds itself, over ssh (measure/targets.py)
name=""  # the target's name in the report: device:<model> over adb, device:<hostname> here, unless given
install_dir=""
out="$PWD/device-results.jsonl"
overrides=""  # --python STACK=PATH, a line each
rounds_override=""
while [ $# -gt 0 ]; do
    case "$1" in
        --host) host_only=1 ;;
        --stacks-only) stacks_only=1 ;;
        --python) [ $# -ge 2 ] && [[ "$2" == *=* ]] || usage_error "--python takes STACK=PATH (e.g. --python candidate=/opt/et/bin/python3)"
                  overrides+="${2%%=*}"$'\t'"${2#*=}"$'\n'; shift ;;
        --install) [ $# -ge 2 ] || usage_error "--install takes a folder for the stacks' venvs"
                   install_dir="$2"; shift ;;
        --rounds) [ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage_error "--rounds takes a whole number ≥ 1"
                  rounds_override="$2"; shift ;;
        --out) [ $# -ge 2 ] || usage_error "--out takes a file name"; out="$2"; shift ;;
        --name) [ $# -ge 2 ] || usage_error "--name takes the target's name"; name="$2"; shift ;;
        -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) usage_error "unknown option $1 (options: --host, --install DIR, --python STACK=PATH, --rounds N, --name NAME, --out FILE, --stacks-only)" ;;
    esac
    shift
done

# Every file as nox -s bundle wrote it: a changed artifact would be timed and judged as the one the report judged.
if command -v sha256sum >/dev/null; then check=(sha256sum --quiet -c SHA256SUMS); else check=(shasum -a 256 --quiet -c SHA256SUMS); fi
if ! changed="$(cd "$here" && "${check[@]}" 2>&1)"; then
    usage_error "the bundle in $here is not as nox -s bundle wrote it: ${changed//$'\n'/; }. Write it again with nox -s bundle"
fi

# shellcheck source=/dev/null
. "$here/settings.env"  # ROUNDS WARMUP CALLS THREADS RTOL ATOL MANIFEST_SHA256, written by nox -s bundle
rounds="${rounds_override:-$ROUNDS}"

# Each stack's Python, the last line for a stack winning: the bundle's venvs, then --install's, then --python's.
# (Files, not bash 4's associative arrays: macOS's /bin/bash is 3.2.)
state="$(mktemp -d)"
trap 'stop_servers 2>/dev/null; rm -rf "$state"' EXIT
cp "$here/pythons.tsv" "$state/pythons"
python_of() { awk -F'\t' -v s="$1" '$1 == s { p = $2 } END { print p }' "$state/pythons"; }
cannot_run() { cat "$state/cannot-run.$1" 2>/dev/null; }  # why a stack has no Python here ("" when it has)

# --install: each stack's venv built here with uv, from its spec's Python and requirements.
if [ -n "$install_dir" ]; then
    command -v uv >/dev/null || usage_error "--install needs uv (python3 -m pip install uv)"
    mkdir -p "$install_dir" || usage_error "cannot make $install_dir"
    install_dir="$(cd "$install_dir" && pwd)"
    while IFS=$'\t' read -r stack _; do
        venv="$install_dir/$stack" log="$install_dir/$stack.install.log"
        version="$(sed -n 's/^# python //p' "$here/stacks/$stack.txt")"
        if uv venv -q --allow-existing --python "$version" "$venv" > "$log" 2>&1 \
            && uv pip install -q --python "$venv/bin/python" -r "$here/stacks/$stack.txt" >> "$log" 2>&1; then
            printf '%s\t%s\n' "$stack" "$venv/bin/python" >> "$state/pythons"
        else  # uv's own words, as one line a JSON string can hold
            printf '%s does not install on %s %s: %s' "$stack" "$(uname -s)" "$(uname -m)" \
                "$(grep -v '^ *$' "$log" | tail -3 | tr -d '"\\' | tr '\n\t' '  ')" > "$state/cannot-run.$stack"
            say "$(cannot_run "$stack") (log: $log)"
        fi
    done < "$here/pythons.tsv"
fi
printf '%s' "$overrides" >> "$state/pythons"
if [ "$stacks_only" = 1 ]; then
    while IFS=$'\t' read -r stack _; do
        printf '%s\t%s\t%s\n' "$stack" "$(python_of "$stack")" "$(cannot_run "$stack")"
    done < "$here/pythons.tsv"
    exit 0
fi

partial="$out.partial"
: > "$partial" || usage_error "cannot write $partial"
printf '{"record": "bundle", "manifest_sha256": "%s", "format": 1, "rounds": %d}\n' "$MANIFEST_SHA256" "$rounds" >> "$partial"
trap 'say "stopped: the rounds so far are in $partial; run the same command again"; exit 3' INT TERM  # EXIT cleans up

failed_line() {  # model stack threads round message: a round whose runner gave no line of its own
    printf '{"record": "failed", "model": "%s", "stack": "%s", "threads": %d, "round": %d, "error": "%s"}\n' \
        "$1" "$2" "$3" "$4" "$5" >> "$partial"
}

# -- on this machine, with each stack's Python runtime ----------------------------------------------------
# One server per stack and model (device_runner.py serve): it loads, verifies and warms up once, then answers
# `round N` on its FIFO with one line, as the measure session's servers do.
trap '' PIPE  # a server that died is a write that fails (its round says so), not the end of this script
ROUND_TIMEOUT_S=600
start_servers() {  # model threads lines
    local index=0 stack runtime artifact methods python why
    while IFS=$'\t' read -r _ stack runtime artifact methods; do
        index=$((index + 1))
        why="$(cannot_run "$stack")"
        if [ -n "$why" ] && [ -z "$(printf '%s' "$overrides" | awk -F'\t' -v s="$stack" '$1 == s')" ]; then
            continue  # its rounds each say why (host_round)
        fi
        rm -f "$state/cannot-run.$stack"  # a --python given for it
        python="$(python_of "$stack")"
        if [ -z "$python" ] || [ ! -x "$python" ]; then
            usage_error "no Python for stack $stack ('${python}' is not an executable): give one with --python $stack=PATH"
        fi
        # File descriptors 3 to 8, two a stack: bash keeps 10 and up for its own redirections.
        [ "$index" -le 3 ] || usage_error "the host path runs at most 3 stacks of a model ($1 has more in plan.tsv)"
        mkfifo "$state/in.$stack" "$state/out.$stack"
        "$python" "$here/device_runner.py" serve --runtime "$runtime" --artifact "$here/$1/$stack/$artifact" \
            --inputs "$here/$1/inputs.npz" --methods "$methods" --model "$1" --stack "$stack" --threads "$2" \
            --warmup "$WARMUP" --calls "$CALLS" --rtol "$RTOL" --atol "$ATOL" \
            < "$state/in.$stack" > "$state/out.$stack" 2>> "$out.log" &
        echo "$! $((1 + 2 * index)) $((2 + 2 * index))" > "$state/server.$stack"
        eval "exec $((1 + 2 * index))>\"\$state/in.\$stack\" $((2 + 2 * index))<\"\$state/out.\$stack\""
    done <<< "$3"
}

stop_servers() {
    local file pid to from
    for file in "$state"/server.*; do
        [ -e "$file" ] || continue
        read -r pid to from < "$file"
        printf 'exit\n' >&"$to" 2>/dev/null
        eval "exec $to>&- $from<&-"
        wait "$pid" 2>/dev/null
        rm -f "$file" "$state/in.${file##*/server.}" "$state/out.${file##*/server.}"
    done
}

host_round() {  # model stack runtime artifact methods threads round
    local pid to from answer
    if [ -n "$(cannot_run "$2")" ]; then failed_line "$1" "$2" "$6" "$7" "$(cannot_run "$2")"; return; fi
    read -r pid to from < "$state/server.$2"
    if printf 'round %d\n' "$7" >&"$to" 2>/dev/null && IFS= read -r -t "$ROUND_TIMEOUT_S" answer <&"$from" \
            && [ -n "$answer" ]; then
        printf '%s\n' "$answer" >> "$partial"
    else
        failed_line "$1" "$2" "$6" "$7" "the runner (pid $pid) gave no answer to round $7: it ended or took over ${ROUND_TIMEOUT_S} s; the last it wrote: $(grep -v '^ *$' "$out.log" 2>/dev/null | tail -1 | tr -d '"\\' | cut -c1-300) (all of it: $out.log)"
    fi
}

# -- on an Android device over adb (not exercised by the tests: docs/device.md) ----------------------------
device_dir=/data/local/tmp/upgrade-gate
android_round() {  # model stack runtime artifact methods threads round
    local where="$device_dir/$1/$2" text value
    if [ "$5" != forward ]; then
        failed_line "$1" "$2" "$6" "$7" "the Android path runs single-method models only (methods: $5)"; return
    fi
    if [ "$3" = executorch-bundled ]; then
        text="$(adb shell "$device_dir/executor_runner --model_path $where/$4 --num_executions $CALLS --cpu_threads $6" < /dev/null 2>&1)"
        value="$(printf '%s\n' "$text" | sed -n 's/.*Model executed successfully [0-9]* time(s) in \([0-9.]*\) ms.*/\1/p' | tail -1)"
        [ -n "$value" ] || { failed_line "$1" "$2" "$6" "$7" "executor_runner printed no time"; return; }
        printf '{"record": "round", "model": "%s", "stack": "%s", "threads": %d, "round": %d, "calls": %d, "verified": true, "samples_ms": {"forward": [%s]}}\n' \
            "$1" "$2" "$6" "$7" "$CALLS" "$(awk -v t="$value" -v n="$CALLS" 'BEGIN { printf "%.6f", t / n }')" >> "$partial"
    else
        text="$(adb shell "$device_dir/speed_benchmark_torch --model=$where/forward.ptl --use_bundled_input=-1 --input_dims=\"$(cat "$here/$1/input_dims.txt")\" --input_type=\"$(cat "$here/$1/input_types.txt")\" --warmup=$WARMUP --iter=$CALLS --report_pep=true" < /dev/null 2>&1)"
        value="$(printf '%s\n' "$text" | sed -n 's/.*"metric": "latency", "value": "\([0-9.]*\)".*/\1/p' | awk '{ printf "%s%.6f", sep, $1 / 1000; sep = ", " }')"
        [ -n "$value" ] || { failed_line "$1" "$2" "$6" "$7" "speed_benchmark_torch printed no time"; return; }
        printf '{"record": "round", "model": "%s", "stack": "%s", "threads": %d, "round": %d, "calls": %d, "verified": null, "samples_ms": {"forward": [%s]}}\n' \
            "$1" "$2" "$6" "$7" "$CALLS" "$value" >> "$partial"
    fi
}

any_python="$(command -v python3 || cut -f2 "$here/pythons.tsv" | head -1)"  # the runner's `target`: stdlib only
if [ "$host_only" = 0 ] && command -v adb >/dev/null && [ "$(adb get-state 2>/dev/null)" = device ]; then
    : "${EXECUTOR_RUNNER:?set EXECUTOR_RUNNER to an executor_runner built for the device (docs/device.md)}"
    : "${SPEED_BENCHMARK_TORCH:?set SPEED_BENCHMARK_TORCH to a speed_benchmark_torch built for the device (docs/device.md)}"
    adb shell "mkdir -p $device_dir" && adb push "$here/." "$device_dir/" >/dev/null \
        && adb push "$EXECUTOR_RUNNER" "$device_dir/executor_runner" >/dev/null \
        && adb push "$SPEED_BENCHMARK_TORCH" "$device_dir/speed_benchmark_torch" >/dev/null \
        || { say "adb push failed"; exit 3; }
    cpuinfo="$(mktemp)"; adb shell cat /proc/cpuinfo > "$cpuinfo"
    "$any_python" "$here/device_runner.py" target "${name:-device:$(adb shell getprop ro.product.model | tr -d '\r')}" \
        --cpuinfo "$cpuinfo" --machine "$(adb shell uname -m | tr -d '\r')" --cores "$(adb shell nproc | tr -d '\r')" \
        --runner adb >> "$partial"
    rm -f "$cpuinfo"
    one_round=android_round
else
    "$any_python" "$here/device_runner.py" target "${name:-device:$(uname -n)}" >> "$partial"
    one_round=host_round
fi

# The stacks take turns, the order reversed every other round, as the measure session's rounds do.
for threads in $THREADS; do
    for model in $(cut -f1 "$here/plan.tsv" | uniq); do
        [ "$one_round" = host_round ] && start_servers "$model" "$threads" "$(awk -F'\t' -v m="$model" '$1 == m' "$here/plan.tsv")"
        for ((round = 1; round <= rounds; round++)); do
            lines="$(awk -F'\t' -v m="$model" '$1 == m' "$here/plan.tsv")"
            if [ $((round % 2)) = 0 ]; then lines="$(printf '%s\n' "$lines" | tac 2>/dev/null || printf '%s\n' "$lines" | tail -r)"; fi
            while IFS=$'\t' read -r _ stack runtime artifact methods; do
                "$one_round" "$model" "$stack" "$runtime" "$artifact" "$methods" "$threads" "$round"
            done <<< "$lines"
        done
        [ "$one_round" = host_round ] && stop_servers
    done
done
# The last line: the digest of every line before it (a file edited afterwards does not read; one without it was stopped).
digest="$( (sha256sum 2>/dev/null || shasum -a 256) < "$partial" | cut -d' ' -f1)"
printf '{"record": "end", "sha256": "%s"}\n' "$digest" >> "$partial"
mv -f "$partial" "$out"
say "wrote $out: read it into the report with upgrade-gate device-results $out --out REPORT"
