#!/bin/sh
# Entry point of the vllm-lookahead images (deploy/docker/Dockerfile, Dockerfile.cpu) and the
# ExecStart of deploy/vllm-lookahead.service.
#
#   entrypoint.sh [MODEL] [vllm serve options...]
#
# runs `vllm-lookahead serve` with these arguments plus
# `--speculative-config "<the JSON of $LOOKAHEAD_PRESET>"`.  `vllm-lookahead serve` is `vllm serve`
# with lookahead and CPU defaults (`vllm-lookahead serve --help` lists them); without a MODEL it
# serves the bundled SmolLM2-135M-Instruct (CPU image, local install).
#
# LOOKAHEAD_PRESET: a preset name from configs/ ("lookahead-shared-pool" or "lookahead-shared-pool.json", looked up
# in $LOOKAHEAD_CONFIGS) or a path to a JSON file (e.g. a mounted Kubernetes ConfigMap).  Empty: no
# preset is added (lookahead with its default settings).  Arguments that already set the speculative
# config (--speculative-config, -sc, --speculative-config.KEY) or turn it off (--no-speculation) win:
# then no preset is added either.
set -eu

configs="${LOOKAHEAD_CONFIGS:-/opt/vllm-lookahead/configs}"
preset="${LOOKAHEAD_PRESET:-}"

for arg in "$@"; do
    case "$arg" in
        --speculative-config | --speculative-config[=.]* | --speculative_config | --speculative_config[=.]* | -sc | -sc[=.]* | --no-speculation)
            preset=""
            ;;
    esac
done

if [ -z "$preset" ]; then
    exec vllm-lookahead serve "$@"
fi

case "$preset" in
    */*) file="$preset" ;;
    *.json) file="$configs/$preset" ;;
    *) file="$configs/$preset.json" ;;
esac
if [ ! -r "$file" ]; then
    echo "vllm-lookahead entrypoint: LOOKAHEAD_PRESET=$preset: no readable file $file" >&2
    for f in "$configs"/*.json; do
        [ -e "$f" ] && echo "  preset: $(basename "$f" .json)" >&2
    done
    exit 2
fi
spec="$(cat "$file")"
echo "vllm-lookahead entrypoint: preset $file" >&2
exec vllm-lookahead serve "$@" --speculative-config "$spec"
