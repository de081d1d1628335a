import logging

from vlmcache.vllm.logs import LOGGER, attach_to_vllm_logging, vllm_logging_config


def test_logging_config_adds_vlmcache_on_vllms_handler():
    cfg = vllm_logging_config()
    assert cfg["loggers"][LOGGER]["handlers"] == cfg["loggers"]["vllm"]["handlers"]
    assert cfg["loggers"][LOGGER]["level"] == "INFO"
    assert set(cfg["loggers"][LOGGER]["handlers"]) <= set(cfg["handlers"])


def test_attach_copies_vllms_handlers_once():
    vllm_logger = logging.getLogger("vllm")
    handler = logging.StreamHandler()
    vllm_logger.addHandler(handler)
    ours = logging.getLogger(LOGGER)
    saved = (list(ours.handlers), ours.level, ours.propagate)
    for h in saved[0]:
        ours.removeHandler(h)
    try:
        attach_to_vllm_logging()
        attach_to_vllm_logging()
        assert ours.handlers == vllm_logger.handlers and handler in ours.handlers
        # pytest's capture handlers sit on the root logger: records still reach them
        assert ours.level == logging.INFO and ours.propagate
    finally:  # other tests read vlmcache's records through the root logger (caplog)
        for h in list(ours.handlers):
            ours.removeHandler(h)
        for h in saved[0]:
            ours.addHandler(h)
        ours.setLevel(saved[1])
        ours.propagate = saved[2]
        vllm_logger.removeHandler(handler)
