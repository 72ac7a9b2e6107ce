#!/usr/bin/env python3
"""run.py - tests/lib/run.py under the name the suite's runner had here: the same arguments,
every subject folder (usage: run.py [-v] [-t SECONDS] [FOLDER...] [FILTER...])."""

import os
import sys

LIB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")
os.execv(sys.executable, [sys.executable, os.path.join(LIB, "run.py")] + sys.argv[1:])
