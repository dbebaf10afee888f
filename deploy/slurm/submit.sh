#!/bin/bash
# Submit every shard of a plan as a Slurm array, and the merge to run after all of them succeeded.
#   PYTHON=/path/.venv/bin/python SUBMISSIONS=submitted PLAN=plan.json RESULTS=grading bash submit.sh
# Extra sbatch options (partition, account...) go in SBATCH_OPTIONS. DRY_RUN=1 prints the two
# sbatch commands instead of submitting.
# When a shard fails, Slurm cancels the merge (--kill-on-invalid-dep=yes) instead of leaving it pending
# for ever: rerun the failed shard, then the merge (docs/grading.md, "On Slurm").
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
: "${SUBMISSIONS:?set SUBMISSIONS}" "${PLAN:?set PLAN}" "${RESULTS:?set RESULTS}"
shards="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["shards"])' "$PLAN")"
read -r -a extra <<< "${SBATCH_OPTIONS:-}"
export PYTHON SUBMISSIONS PLAN RESULTS

shard_cmd=(sbatch --parsable ${extra[@]+"${extra[@]}"} --array="0-$((shards - 1))" "$here/grade-shard.sbatch")
merge_cmd=(sbatch --parsable ${extra[@]+"${extra[@]}"} --kill-on-invalid-dep=yes)
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${shard_cmd[@]}"; printf '\n'
    printf '%q ' "${merge_cmd[@]}" --dependency=afterok:JOBID "$here/merge.sbatch"; printf '\n'
    exit 0
fi
job="$("${shard_cmd[@]}")"
job="${job%%;*}"
merge="$("${merge_cmd[@]}" --dependency="afterok:$job" "$here/merge.sbatch")"
echo "shards: job array $job (0-$((shards - 1))); merge: job ${merge%%;*}, after all shards succeed" \
     "(cancelled if one fails: rerun it, then the merge)"
