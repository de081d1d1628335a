#!/usr/bin/env bash
# Bundle this machine's redis-server with every shared library it loads (glibc's loader
# included) into .gpu/redis.tgz, for a lent GPU machine that has no Redis (issue 35's
# replicas benchmark: scripts/gpu_replicas.sh unpacks it and puts its `redis-server`
# wrapper first on PATH, where vlmcache.testing.redis_server finds it).
#   bash scripts/bundle_redis.sh        # -> .gpu/redis.tgz (carry it: ~7 MB)
# The wrapper runs the binary through the bundled ld.so with only the bundled libraries,
# so the GPU image's own glibc version does not matter.
set -euo pipefail
exe=$(readlink -f "$(command -v redis-server)")
dir=$(mktemp -d)/redis
mkdir -p "$dir/lib"
cp "$exe" "$dir/redis-server-bin"
ldd "$exe" | grep -o '/[^ ]*\.so[^ ]*' | while read -r lib; do
  [ -f "$lib" ] && cp -L "$lib" "$dir/lib/"
done
cat > "$dir/redis-server" <<'WRAP'
#!/bin/sh
d=$(dirname "$(readlink -f "$0")")
exec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/redis-server-bin" "$@"
WRAP
chmod +x "$dir/redis-server"
"$dir/redis-server" --version
# the redis-py client too: the GPU image has none (the first GPU run's engines failed with
# "'redis' is needed for this feature"); pure Python, put on PYTHONPATH by gpu_replicas.sh
py=$(python3 -c "import os, redis; print(os.path.dirname(redis.__file__))")
mkdir -p "$dir/py" && cp -r "$py" "$dir/py/" && find "$dir/py" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .gpu
tar czf .gpu/redis.tgz -C "$(dirname "$dir")" redis
rm -rf "$(dirname "$dir")"
ls -la .gpu/redis.tgz
