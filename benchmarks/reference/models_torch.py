"""The reference scripts' name for python/ddp_models.py (the built-in models in
PyTorch, with the C++ names), which ships with ddp."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from ddp_models import *  # noqa: E402,F401,F403
