"""A slow import for the forkserver's preload (tests/test_worker_lifetime.py): it marks
the working directory when it starts, then takes a few seconds, as torch's import does."""

import time
from pathlib import Path

Path("preloading").touch()
time.sleep(5)
