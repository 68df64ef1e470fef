"""The engines' own tests are written against torch: without it (the CPU-only CI install)
there is nothing of theirs to run, so their files are not collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["test_*.py"]
