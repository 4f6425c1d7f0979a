#!/usr/bin/env bash
# The acceptance check of one Paddle version against an installed (not editable) paddle_dist,
# run from outside the checkout:
#   bash tools/check_paddle_version.sh 2.6.2 [WORKDIR]
# It builds the wheel, makes WORKDIR/venv with paddlepaddle==VERSION and the wheel, and in
# WORKDIR runs: the built-in job at both API levels (2 ranks, 2 epochs, test accuracy >= 0.9),
# overlap over the backend, a rank killed after the first checkpoint and the same command
# continuing (final weights digest equal to an uninterrupted run's), and doctor --test.
# Prints one PASS/FAIL line per check; exits 1 if any failed. About 4 minutes on 2 cores.
set -uo pipefail
VERSION=${1:?usage: check_paddle_version.sh VERSION [WORKDIR]}
WORK=${2:-/tmp/paddle-$VERSION-check}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$WORK/venv/bin/python
NUMPY=$([[ $VERSION == 2.6* ]] && echo '"numpy<2" "pandas<3"')
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 2
python3 -m venv venv && venv/bin/pip install -q --disable-pip-version-check wheel >/dev/null 2>&1
venv/bin/pip wheel -q --no-deps -w wheel "$ROOT" >/dev/null 2>&1 || { echo "FAIL wheel build"; exit 1; }
eval venv/bin/pip install -q --disable-pip-version-check "paddlepaddle==$VERSION" "$NUMPY" wheel/*.whl \
    2>&1 | grep -v "^WARNING" || true
$PY -c "import paddle_dist, paddle, sys; assert '$ROOT' not in paddle_dist.__file__; print('paddle', paddle.__version__, 'paddle_dist', paddle_dist.__file__)"
failed=0
say() { if [ "$1" = 0 ]; then echo "PASS $2"; else echo "FAIL $2"; failed=1; fi; }
metric() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]+'/metrics.json'))['test_accuracy'])" "$1"; }
digest() { $PY -c "import json,glob,sys; print({json.load(open(f)).get('weights_sha256') for f in glob.glob(sys.argv[1]+'/status/rank*.json')})" "$1"; }
JOB=(-m paddle_dist.train -o dist.nprocs=2 -o train.epochs=2)

for api in loop hapi; do
    timeout 600 $PY "${JOB[@]}" -o train.api=$api -o output.run_dir=$WORK/$api > $api.log 2>&1
    acc=$(metric $WORK/$api 2>/dev/null || echo 0)
    $PY -c "import sys; sys.exit(float('$acc') < 0.9)"; say $? "train api=$api: test accuracy $acc"
done
timeout 600 $PY "${JOB[@]}" -o sync.mode=overlap -o sync.transport=backend -o output.run_dir=$WORK/overlap \
    > overlap.log 2>&1; say $? "sync.mode=overlap sync.transport=backend: accuracy $(metric $WORK/overlap 2>/dev/null)"

# Kill + the same command continuing, against an uninterrupted run.
RESUME=(-o checkpoint.every_steps=10 -o output.root=$WORK/runs)
timeout 600 $PY "${JOB[@]}" "${RESUME[@]}" -o output.root=$WORK/whole > whole.log 2>&1
timeout 600 $PY "${JOB[@]}" "${RESUME[@]}" > killed.log 2>&1 &
job=$!
for _ in $(seq 600); do compgen -G "$WORK/runs/*/checkpoints/ckpt_*" >/dev/null && break; sleep 0.1; done
pid=$($PY -c "import json,glob; print(json.load(open(glob.glob('$WORK/runs/*/status/rank1.json')[0]))['pid'])")
kill -9 "$pid"; wait $job
timeout 600 $PY "${JOB[@]}" "${RESUME[@]}" > continued.log 2>&1
grep -q "continuing the unfinished run" continued.log; say $? "the same command continues the killed run"
a=$(digest "$(ls -d $WORK/whole/*/ | head -1)"); b=$(digest "$(ls -d $WORK/runs/*/ | head -1)")
[ "$a" = "$b" ] && [ "$(echo "$a" | tr -cd , | wc -c)" = 0 ]; say $? "continued weights equal the uninterrupted run's: $b"

timeout 600 $PY -m paddle_dist.doctor --test > selftest.log 2>&1; say $? "doctor --test ($(grep -c ' PASS ' selftest.log) PASS)"
exit $failed
