#!/bin/bash
# Print the shard Job of grade-shards.yaml for ONE index, to rerun a shard that failed for good
# (the Job lists it in status.failedIndexes once its per-index retries are used up):
#   bash deploy/kubernetes/rerun-shard.sh 5 | kubectl apply -f -
# The pod runs `--shard 5/N` (an explicit index wins over JOB_COMPLETION_INDEX) into the same
# folder, so it resumes from what that shard already graded. Then run the merge again.
set -euo pipefail

index="${1:?usage: rerun-shard.sh INDEX [MANIFEST]}"
manifest="${2:-$(dirname "${BASH_SOURCE[0]}")/grade-shards.yaml}"
if [[ ! "$index" =~ ^[0-9]+$ ]]; then
    echo "error: INDEX must be a shard index (a whole number); got '$index'" >&2
    exit 2
fi
shards="$(sed -n 's/^  completions: *\([0-9][0-9]*\).*/\1/p' "$manifest")"
if [[ -z "$shards" ]] || (( 10#$index >= shards )); then
    echo "error: INDEX is $index, but $manifest has ${shards:-no} completions (shards 0 to $((${shards:-1} - 1)))" >&2
    exit 2
fi
index=$((10#$index))
sed -e "s/^  name: grade-shards\$/  name: grade-shard-$index/" \
    -e "s/^  completions: .*/  completions: 1/" \
    -e "s/^  parallelism: .*/  parallelism: 1/" \
    -e "s#--shard auto/$shards#--shard $index/$shards#" \
    -e "s#\${JOB_COMPLETION_INDEX}#$index#" \
    "$manifest"
