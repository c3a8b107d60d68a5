"""The reference scripts' name for python/ddp_models.py (the built-in models in
PyTorch, with the C++ names), which ships with ddp."""
import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # after PYTHONPATH: a built ddp_torch comes first
from ddp_models import *  # noqa: E402,F401,F403
