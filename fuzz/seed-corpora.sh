#!/bin/sh
# Build the seed corpora, fuzz/corpus/<target>/, from the repository's goldens and from
# synthetic outputs of `ds41` (synth, forward --save-state, certify --report). Nothing here is
# committed: rerun this script on a fresh checkout before fuzzing.
#
#   fuzz/seed-corpora.sh            # uses target/debug/ds41 (built if missing)
#   DS41=/path/to/ds41 fuzz/seed-corpora.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
corpus=$here/corpus
ds41=${DS41:-$root/target/debug/ds41}
if [ ! -x "$ds41" ]; then
    (cd "$root" && cargo build -q -p ds41-conformance --bin ds41)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

seed() { # seed TARGET NAME < bytes
    mkdir -p "$corpus/$1"
    cat > "$corpus/$1/$2"
}
seed_file() { # seed_file TARGET FILE [PREFIX_BYTE_OCTAL]
    if [ $# -eq 3 ]; then
        { printf "\\$3"; cat "$2"; } | seed "$1" "$(basename "$2")"
    else
        seed "$1" "$(basename "$2")" < "$2"
    fi
}

# Checkpoints: the synthetic presets the targets use as their fixtures.
"$ds41" synth --preset tiny --layout release --seed 1 --out "$tmp/tiny" >/dev/null
"$ds41" synth --preset tiny-sharded --layout release --seed 1 --out "$tmp/sharded" >/dev/null
"$ds41" synth --preset waste-tiny --layout container --seed 1 --out "$tmp/waste" >/dev/null
seed_file safetensors_shard "$tmp/tiny/model.safetensors"
# A header-only shard: the same header with the data cut off (small, reaches the checks).
python3 - "$tmp/tiny/model.safetensors" "$tmp/header-only.safetensors" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
open(sys.argv[2], "wb").write(b[:8 + n])
PY
seed_file safetensors_shard "$tmp/header-only.safetensors"
seed_file safetensors_index "$tmp/sharded/model.safetensors.index.json"
seed_file container_manifest "$tmp/waste/manifest.json"
for f in "$tmp"/waste/experts-L*.bin; do seed_file container_bank "$f"; break; done
seed_file container_codebooks "$tmp/waste/codebooks.bin"
seed_file container_engram "$tmp/waste/engram.json" 000
seed_file container_engram "$tmp/waste/engram-tokmap.bin" 001
for f in "$tmp"/waste/engram-L*.bin; do seed_file container_engram "$f" 002; break; done

# State files: saved after a prefill and after decode steps.
"$ds41" forward --model "$tmp/tiny" --tokens 5,9,13,2 --out "$tmp/t1.safetensors" \
    --save-state "$tmp/prefill.state" 2>/dev/null
"$ds41" forward --model "$tmp/tiny" --tokens 5,9,13,2,7,7,30 --prefill 3 \
    --out "$tmp/t2.safetensors" --save-state "$tmp/decode.state" 2>/dev/null
seed_file state_file "$tmp/prefill.state"
seed_file state_file "$tmp/decode.state"

# Tokenizers: every tokenizer.json the repository or the synthetic presets carry.
find "$root/goldens" "$tmp" -name 'tokenizer*.json' -size -16M | while read -r f; do
    seed_file tokenizer_json "$f"
done

# DSML: rendered golden prompts and conversations; completions in both grammars' shapes.
for f in "$root"/goldens/dsml/*.txt; do
    seed_file dsml_strict "$f"
    seed_file dsml_tolerant "$f"
done
for f in "$root"/goldens/dsml/*.json; do seed_file render_conversation "$f"; done
i=0
for c in \
    'Hello<｜end▁of▁sentence｜>' \
    'reason</think>answer<｜end▁of▁sentence｜>' \
    'ok

<｜DSML｜ calls>
<｜DSML｜ invoke name="ns::f">
<｜DSML｜ parameter name="q" string="true">v</｜DSML｜ parameter>
<｜DSML｜ parameter name="n" string="false">[1, 2]</｜DSML｜ parameter>
</｜DSML｜ invoke>
</｜DSML｜ calls><｜end▁of▁sentence｜>' \
    'x
<｜DSML｜tool_calls>
<｜DSML｜invoke name="g">
<|DSML| parameter name="y" string="false">not json</|DSML| parameter>
</｜DSML｜invoke>
</｜DSML｜tool_calls>tail' ; do
    i=$((i + 1))
    printf '%s' "$c" | seed dsml_strict "completion-$i"
    printf '%s' "$c" | seed dsml_tolerant "completion-$i"
done

# Protocol request lines (the serve-adapter side; requests naming a model are skipped by the
# target).
i=0
for line in \
    '{"id": 1, "op": "hello", "protocol": "ds41-engine/1"}' \
    '{"id": 2, "op": "render", "conversation": {"messages": [{"role": "user", "content": "hi"}]}, "thinking_mode": "chat"}' \
    '{"id": 3, "op": "parse", "completion": "x<｜end▁of▁sentence｜>", "thinking": false, "tolerant": true}' \
    '{"id": 4, "op": "tokenize", "tokenizer": "/nonexistent/tokenizer.json", "texts": ["hello"], "markup": false}' \
    '{"id": 5, "op": "shutdown"}' ; do
    i=$((i + 1))
    printf '%s\n' "$line" | seed protocol_request "request-$i"
done

# YAML: cases, gates (first byte picks the file), profiles, expected failures.
find "$root/conformance/cases" -name '*.yaml' | while read -r f; do
    seed yaml_case "$(basename "$(dirname "$f")")-$(basename "$f")" < "$f"
done
seed_file yaml_gates "$root/gates/exact.yaml" 000
seed_file yaml_gates "$root/gates/upstream.yaml" 001
seed_file yaml_gates "$root/gates/quantized.yaml" 002
for f in "$root"/conformance/profiles/*.yaml; do seed_file yaml_profile "$f"; done
for f in "$root"/gates/expected-failures/*.yaml; do seed_file yaml_expected_failures "$f"; done

# A certificate from a short certify run.
"$ds41" certify --filter dsml --report "$tmp/report" >/dev/null 2>&1 || true
if [ -f "$tmp/report/certificate.json" ]; then
    seed_file certificate "$tmp/report/certificate.json"
fi

for d in "$corpus"/*/; do
    printf '%-24s %4d files %8d bytes\n' "$(basename "$d")" "$(ls "$d" | wc -l)" \
        "$(cat "$d"/* | wc -c)"
done
