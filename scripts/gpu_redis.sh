# Sourced by the GPU scripts. redis_bundle DIR: unpack .gpu/redis.tgz (scripts/bundle_redis.sh,
# carried) into DIR/redis; sets `path` (PATH with its redis-server first, where
# vlmcache.testing.redis_server finds it) and `redispy` (the redis-py client's PYTHONPATH
# entry, with its colon); both stay plain when there is no bundle or it does not run.
redis_bundle() {
  path=$PATH redispy=""
  if [ ! -f .gpu/redis.tgz ]; then echo "no .gpu/redis.tgz carried: no Redis"; return 0; fi
  rm -rf "$1/redis" && mkdir -p "$1" && tar xzf .gpu/redis.tgz -C "$1" \
    && "$1/redis/redis-server" --version && path=$1/redis:$PATH \
    || echo "bundled redis-server does not run"
  if [ -d "$1/redis/py/redis" ]; then redispy=$1/redis/py:; fi
  return 0
}
