"""vlmcache's offloading spec module: what it changes in vLLM's processes on import."""

import logging

from vlmcache_lab.faults import WarningLog
from vlmcache.vllm.offload_spec import REGION_LOGGER


def test_only_the_unlink_warning_of_the_region_file_vlmcache_removed_is_dropped():
    # a handler on the logger itself: vLLM's loggers may not propagate to the root's
    region_log, seen = logging.getLogger(REGION_LOGGER), WarningLog()
    region_log.addHandler(seen)
    try:
        try:
            raise FileNotFoundError(2, "No such file or directory")
        except FileNotFoundError:
            region_log.warning("Failed to unlink path %s", "/dev/shm/x.mmap", exc_info=True)
        try:
            raise PermissionError(13, "Permission denied")
        except PermissionError:
            region_log.warning("Failed to unlink path %s", "/dev/shm/y.mmap", exc_info=True)
        region_log.warning("Failed to close fd %s", 7)
    finally:
        region_log.removeHandler(seen)
    assert seen.messages == ["Failed to unlink path /dev/shm/y.mmap", "Failed to close fd 7"]
